"""The catalogue: load the YAML folder (``load``), compile it for OPA (``compile``), and
name what a request gives that it does not declare (``names``)."""

from capgate.gateway.catalogue.compile import catalogue_digest, compile_catalogue
from capgate.gateway.catalogue.load import CATALOGUE_FILES, load_catalogue
from capgate.gateway.catalogue.names import undeclared_names

__all__ = [
    "CATALOGUE_FILES",
    "catalogue_digest",
    "compile_catalogue",
    "load_catalogue",
    "undeclared_names",
]
