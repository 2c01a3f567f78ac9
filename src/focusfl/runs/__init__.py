"""One run: its configuration (the single source of its fields and defaults), its folder
format, the driver, checkpoints and TensorBoard logs."""
