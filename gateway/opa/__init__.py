"""The OPA side: find the binary, write bundles, run OPA, ask it for decisions.

``binary`` finds and version-checks OPA; ``policies`` locates the Rego shipped with
capgate; ``bundle`` writes policies plus compiled catalogue; ``process`` runs a
private OPA; ``client`` asks for decisions and fails closed, over ``transport``
(HTTP/1.1 from the standard library, held to one deadline); ``sidecar`` picks an
external or embedded OPA and checks it serves our catalogue; ``deploy`` makes what a
deployed, locked-down sidecar needs (token, signing keys, OPA config, signed bundle).
"""
