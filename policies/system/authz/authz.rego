# METADATA
# title: OPA API authorisation
# description: |
#   Who may use a deployed OPA's REST API (OPA run with --authentication=token
#   --authorization=basic). Only the gateway may ask for decisions: GET or POST under
#   /v1/data/capgate/..., with no query parameter but provenance, presenting a bearer
#   token whose SHA-256 is in data.system.gateway.tokens (written into the signed
#   deployment bundle by `capgate bundle --sign-key`; the token itself never is).
#   Anyone on the machine may ask GET /health, which tells only whether OPA is up and
#   its bundles are active, so process supervisors can probe it without the token.
#   Only in a deployment made with `capgate deploy init --allow-opa-metrics` (the
#   signed bundle then sets data.system.gateway.diagnostics.metrics to true), anyone
#   on the machine may also ask GET /metrics, OPA's Prometheus metrics, so Prometheus
#   can scrape it without the token; off by default.
#   Nothing else is allowed to anyone, the gateway included: no policy or data
#   writes, no reading of /v1/policies, of other data or of config or status, no
#   ad-hoc queries, no explain or instrument. Until the bundle that carries this
#   policy is active, OPA refuses every request.
package system.authz

# METADATA
# title: Allow
# description: |
#   true when the request is one of those above; false for every other request,
#   which OPA then refuses with 401 before any handler runs.
# entrypoint: true
default allow := false

allow if {
	input.method == "GET"
	input.path == ["health"]
	_only_params({"bundles", "plugins"})
}

# OPA's Prometheus metrics, opened by the deployment, never by a request: the flag
# is data of the signed bundle, and only the boolean true opens it. Exactly GET
# /metrics with no query parameter: not /metrics/alloc_bytes, not another method.
# OPA applies this policy on its --diagnostic-addr listener too (v1.22.4), so this
# rule is what opens /metrics there as well.
allow if {
	input.method == "GET"
	input.path == ["metrics"]
	_only_params(set())
	data.system.gateway.diagnostics.metrics == true
}

allow if {
	_is_gateway
	input.method in {"GET", "POST"}
	_is_capgate_document
	_only_params({"provenance"})
}

# The bearer token's SHA-256 (lower-case hex) is one of the gateway tokens this
# deployment's bundle lists. input.identity is undefined without a token.
_is_gateway if data.system.gateway.tokens[crypto.sha256(input.identity)]

# /v1/data/capgate/<name>/...: a document under capgate, each segment a plain name
# (no empty, "." or ".." segment, which OPA would read as a key of that name).
_is_capgate_document if {
	count(input.path) > 3
	array.slice(input.path, 0, 3) == ["v1", "data", "capgate"]
	every segment in array.slice(input.path, 3, count(input.path)) {
		regex.match(`^[A-Za-z0-9_]+$`, segment)
	}
}

# Every query parameter of the request is one of allowed (none at all is fine).
_only_params(allowed) if every name, _ in object.get(input, "params", {}) {
	name in allowed
}
