"""The catalogue: load the YAML folder (``load``), compile it for OPA (``compile``)."""

from gateway.catalogue.compile import catalogue_digest, compile_catalogue
from gateway.catalogue.load import CATALOGUE_FILES, load_catalogue

__all__ = ["CATALOGUE_FILES", "catalogue_digest", "compile_catalogue", "load_catalogue"]
