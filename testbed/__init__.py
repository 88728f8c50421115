"""gc-testbed: measure when gradient compression beats synchronous SGD on shaped links."""

__version__ = "0.1.0"
