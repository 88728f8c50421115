"""The adversarial suite (a package, so its conftest never shadows tests/conftest.py for `from conftest import`)."""
