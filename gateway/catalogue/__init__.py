"""The catalogue: load the YAML folder (``load``), compile it for OPA (``compile``)."""

from capgate.gateway.catalogue.compile import catalogue_digest, compile_catalogue
from capgate.gateway.catalogue.load import CATALOGUE_FILES, load_catalogue

__all__ = ["CATALOGUE_FILES", "catalogue_digest", "compile_catalogue", "load_catalogue"]
