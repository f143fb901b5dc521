# The package's version: that of the g4.h whose structs g4/_capi.py mirrors (the loaded libg4 must
# report the same through g4_version()). pyproject.toml and setup.py read it from here.
__version__ = "0.1.0"
