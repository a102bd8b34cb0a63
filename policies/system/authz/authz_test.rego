package system.authz_test

import data.system.authz

# The gateway's token and its SHA-256, as `capgate bundle --sign-key` lists it.
_token := "gw-token-7c1d"

_tokens := {crypto.sha256(_token): {}}

_decision_paths := [
	["v1", "data", "capgate", "compose", "decision"],
	["v1", "data", "capgate", "execute", "decision"],
	["v1", "data", "capgate", "review", "decision"],
]

_provenance := {"provenance": ["true"]}

test_allow_gateway_asks_for_decisions if every path in _decision_paths {
	request := {"method": "POST", "path": path, "params": _provenance, "identity": _token}
	authz.allow with input as request with data.system.gateway.tokens as _tokens
}

test_allow_gateway_reads_the_catalogue_digest if {
	path := ["v1", "data", "capgate", "catalogue", "meta", "digest"]
	request := {"method": "GET", "path": path, "params": _provenance, "identity": _token}
	authz.allow with input as request with data.system.gateway.tokens as _tokens
}

test_allow_anyone_asks_for_health if {
	requests := [
		{"method": "GET", "path": ["health"], "params": {}},
		{"method": "GET", "path": ["health"], "params": {"bundles": ["true"]}},
		{"method": "GET", "path": ["health"], "params": {"bundles": [""], "plugins": [""]}},
		{"method": "GET", "path": ["health"], "params": {"bundles": ["true"]}, "identity": _token},
		{"method": "GET", "path": ["health"], "params": {"bundles": ["true"]}, "identity": "wrong"},
		{"method": "GET", "path": ["health"]},
	]
	every request in requests {
		authz.allow with input as request with data.system.gateway.tokens as _tokens
	}
}

test_deny_without_the_gateways_token if {
	identities := [null, "", "wrong", upper(_token), concat("", [_token, " "]), crypto.sha256(_token)]
	every path in _decision_paths {
		anonymous := {"method": "POST", "path": path, "params": {}}
		not authz.allow with input as anonymous with data.system.gateway.tokens as _tokens
		every identity in identities {
			request := object.union(anonymous, {"identity": identity})
			not authz.allow with input as request with data.system.gateway.tokens as _tokens
		}
	}
}

test_deny_when_the_bundle_lists_no_token if {
	request := {"method": "POST", "path": _decision_paths[0], "params": {}, "identity": _token}
	not authz.allow with input as request with data.system.gateway.tokens as {}
	not authz.allow with input as request
}

# What nobody may do, the gateway included: write, delete, read policies or other
# data, query ad hoc, read config, status or metrics, or ask for explanations.
test_deny_everything_else_even_to_the_gateway if {
	requests := [
		{"method": "PUT", "path": ["v1", "policies", "capgate", "x"]},
		{"method": "DELETE", "path": ["v1", "policies", "capgate", "x"]},
		{"method": "GET", "path": ["v1", "policies"]},
		{"method": "GET", "path": ["v1", "policies", "capgate", "execute", "execute.rego"]},
		{"method": "PUT", "path": ["v1", "data", "capgate", "catalogue"]},
		{"method": "PATCH", "path": ["v1", "data", "capgate", "catalogue"]},
		{"method": "DELETE", "path": ["v1", "data", "capgate", "catalogue"]},
		{"method": "PUT", "path": ["v1", "data", "anything"]},
		{"method": "PUT", "path": ["v1", "data"]},
		{"method": "PATCH", "path": ["v1", "data"]},
		{"method": "POST", "path": ["v1", "data"]},
		{"method": "GET", "path": ["v1", "data"]},
		{"method": "GET", "path": ["v1", "data", "capgate"]},
		{"method": "GET", "path": ["v1", "data", "system", "gateway", "tokens"]},
		{"method": "POST", "path": ["v1", "data", "system", "authz", "allow"]},
		{"method": "POST", "path": ["v1", "query"]},
		{"method": "GET", "path": ["v1", "query"]},
		{"method": "POST", "path": ["v1", "compile"]},
		{"method": "POST", "path": [""]},
		{"method": "POST", "path": ["v0", "data", "capgate", "compose", "decision"]},
		{"method": "GET", "path": ["v1", "config"]},
		{"method": "GET", "path": ["v1", "status"]},
		{"method": "GET", "path": ["metrics"]},
		{"method": "POST", "path": ["health"]},
		{"method": "GET", "path": ["health", "live"]},
		{"method": "GET", "path": ["v1", "data", "capgate", "", "decision"]},
		{"method": "GET", "path": ["v1", "data", "capgate", "..", "..", "v1", "policies"]},
		{"method": "GET", "path": ["v1", "data", "capgate", ".", "compose", "decision"]},
		{"method": "DELETE", "path": ["v1", "data", "capgate", "compose", "decision"]},
		{"method": "PUT", "path": ["v1", "data", "capgate", "compose", "decision"]},
	]
	every request in requests {
		as_gateway := object.union(request, {"params": {}, "identity": _token})
		not authz.allow with input as as_gateway with data.system.gateway.tokens as _tokens
		anonymous := object.union(request, {"params": {}})
		not authz.allow with input as anonymous with data.system.gateway.tokens as _tokens
	}
}

test_deny_query_parameters_other_than_provenance if {
	params := [
		{"explain": ["full"]},
		{"instrument": ["true"]},
		{"metrics": ["true"]},
		{"pretty": ["true"]},
		{"provenance": ["true"], "explain": ["notes"]},
		{"strict-builtin-errors": ["true"]},
	]
	every extra in params {
		request := {"method": "POST", "path": _decision_paths[1], "params": extra, "identity": _token}
		not authz.allow with input as request with data.system.gateway.tokens as _tokens
	}
}

test_deny_health_with_other_query_parameters if {
	request := {"method": "GET", "path": ["health"], "params": {"explain": ["full"]}}
	not authz.allow with input as request with data.system.gateway.tokens as _tokens
}
