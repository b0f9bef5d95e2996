"""The package version: the one source read by setup.py, ``specdec_kernels.__version__`` and ``specdec.__version__``."""

__version__ = "0.2.0"
