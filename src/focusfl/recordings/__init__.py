"""Recordings of other projects (FedScale, FLASH, availability matrices, device capacity files),
untrusted files parsed into focusfl's availability trace and work trace (docs/architecture.md)."""
