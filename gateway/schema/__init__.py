"""capgate's JSON Schema dialect for tool contracts: 2020-12 with every keyword and
format checked. Its words (``dialect``), what a schema must pass to load
(``load_check``), the validator every call runs (``validator``), and ECMA-262
patterns and strict formats (``formats``)."""
