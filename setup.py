# Metadata lives in setup.cfg; this shim lets older pips do editable installs.
from setuptools import setup

setup()
