"""capgate's JSON Schema dialect for tool contracts: 2020-12 with every keyword and
format checked (``validator``), ECMA-262 patterns and strict formats (``formats``)."""
