"""Running and packaging OPA: find the binary, write bundles, run OPA, deploy it.

``binary`` finds and version-checks OPA; ``policies`` locates the Rego shipped with
capgate, and ``declarations`` reads the checks it declares; ``bundle`` writes
policies plus compiled catalogue; ``process`` runs a private OPA; ``workdir`` keeps
its folders private; ``sidecar`` picks an external or embedded OPA, checks it serves
our catalogue and hands out the policy client (:mod:`capgate.gateway.policy`);
``deploy`` makes what a deployed, locked-down sidecar needs (token, signing keys, OPA
config, signed bundle).
"""
