"""Print, on one line, the Python and the versions of the packages the suite runs with ("absent"
for an optional one that is not installed): .ci/run and scripts/compat.sh start their logs with it."""
import importlib.metadata
import platform

PACKAGES = ("torch", "numpy", "matplotlib", "pytest", "pytest-xdist", "scipy", "flwr", "ray", "transformers",
            "datasets", "flwr-datasets", "tensorboard")


def version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


if __name__ == "__main__":
    print(f"python {platform.python_version()}; " + ", ".join(f"{name} {version(name)}" for name in PACKAGES))
