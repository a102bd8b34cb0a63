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

# OPA's GET /metrics, which a deployment opens only with `capgate deploy init
# --allow-opa-metrics` (the signed bundle then carries diagnostics.metrics: true).

_metrics := {"method": "GET", "path": ["metrics"], "params": {}}

_metrics_open := {"tokens": _tokens, "diagnostics": {"metrics": true}}

test_deny_metrics_unless_the_deployment_opened_them if {
	closed := [
		{"tokens": _tokens},
		{"tokens": _tokens, "diagnostics": {}},
		{"tokens": _tokens, "diagnostics": {"metrics": false}},
		{"tokens": _tokens, "diagnostics": {"metrics": "true"}},
		{"tokens": _tokens, "diagnostics": {"metrics": 1}},
		{"tokens": _tokens, "diagnostics": {"metrics": [true]}},
		{"tokens": _tokens, "diagnostics": true},
	]
	requests := [_metrics, object.union(_metrics, {"identity": _token})]
	every request in requests {
		not authz.allow with input as request
		every gateway in closed {
			not authz.allow with input as request with data.system.gateway as gateway
		}
	}
}

# Each row: a request (anonymous unless it names an identity) and whether a
# deployment with metrics open lets it through. Only GET /metrics itself is opened;
# decisions still want the token, and nothing else opens for anyone.
_metrics_open_rows := {
	"GET /metrics": {"request": _metrics, "allow": true},
	"GET /metrics, no params field": {"request": {"method": "GET", "path": ["metrics"]}, "allow": true},
	"GET /metrics with the gateway's token": {"request": _with(_metrics, {"identity": _token}), "allow": true},
	"GET /metrics with a wrong token": {"request": _with(_metrics, {"identity": "wrong"}), "allow": true},
	"POST /metrics": {"request": _req("POST", ["metrics"]), "allow": false},
	"PUT /metrics": {"request": _req("PUT", ["metrics"]), "allow": false},
	"DELETE /metrics": {"request": _req("DELETE", ["metrics"]), "allow": false},
	"HEAD /metrics": {"request": _req("HEAD", ["metrics"]), "allow": false},
	"GET /metrics?x=1": {"request": _with(_metrics, {"params": {"x": ["1"]}}), "allow": false},
	"GET /metrics?explain=full": {"request": _with(_metrics, {"params": {"explain": ["full"]}}), "allow": false},
	"GET /metrics/alloc_bytes": {"request": _req("GET", ["metrics", "alloc_bytes"]), "allow": false},
	"GET /metrics/": {"request": _req("GET", ["metrics", ""]), "allow": false},
	"GET //metrics": {"request": _req("GET", ["", "metrics"]), "allow": false},
	"GET /METRICS": {"request": _req("GET", ["METRICS"]), "allow": false},
	"GET /metrics%2F (unescaped)": {"request": _req("GET", ["metrics/"]), "allow": false},
	"GET /metrics/../v1/data": {"request": _req("GET", ["metrics", "..", "v1", "data"]), "allow": false},
	"GET /metrics/../v1/data/system/gateway/tokens": {
		"request": _req("GET", ["metrics", "..", "v1", "data", "system", "gateway", "tokens"]),
		"allow": false,
	},
	"GET /metrics/./": {"request": _req("GET", ["metrics", ".", ""]), "allow": false},
	"GET /v1/data/../../metrics": {"request": _req("GET", ["v1", "data", "..", "..", "metrics"]), "allow": false},
	"GET /v1/data": {"request": _req("GET", ["v1", "data"]), "allow": false},
	"GET /v1/data/metrics": {"request": _req("GET", ["v1", "data", "metrics"]), "allow": false},
	"GET /v1/data/system/gateway/diagnostics": {
		"request": _req("GET", ["v1", "data", "system", "gateway", "diagnostics"]),
		"allow": false,
	},
	"POST a decision without a token": {"request": _req("POST", _decision_paths[0]), "allow": false},
	"GET the catalogue digest without a token": {
		"request": _req("GET", ["v1", "data", "capgate", "catalogue", "meta", "digest"]),
		"allow": false,
	},
	"POST a decision with the gateway's token": {
		"request": {"method": "POST", "path": _decision_paths[0], "params": _provenance, "identity": _token},
		"allow": true,
	},
	"GET /v1/policies": {"request": _req("GET", ["v1", "policies"]), "allow": false},
	"PUT /v1/policies/system/authz": {"request": _req("PUT", ["v1", "policies", "system", "authz"]), "allow": false},
	"GET /v1/config": {"request": _req("GET", ["v1", "config"]), "allow": false},
	"GET /v1/status": {"request": _req("GET", ["v1", "status"]), "allow": false},
	"POST /v1/query": {"request": _req("POST", ["v1", "query"]), "allow": false},
	"GET /debug/pprof/": {"request": _req("GET", ["debug", "pprof", ""]), "allow": false},
	"GET /health": {"request": _req("GET", ["health"]), "allow": true},
}

_req(method, path) := {"method": method, "path": path, "params": {}}

_with(request, fields) := object.union(request, fields)

test_allow_only_get_metrics_when_the_deployment_opened_them if {
	got := {name: answer |
		some name, row in _metrics_open_rows

		# A comprehension's term cannot carry `with`, so the answer is assigned first.
		# regal ignore:comprehension-term-assignment
		answer := authz.allow with input as row.request with data.system.gateway as _metrics_open
	}
	want := {name: row.allow | some name, row in _metrics_open_rows}
	wrong := {name: {"got": object.get(got, name, "no answer"), "want": expected} |
		some name, expected in want
		object.get(got, name, "no answer") != expected
	}

	# Names the rows that failed: opa test shows a failing test's print output.
	# regal ignore:print-or-trace-call
	print("rows that failed:", count(wrong), wrong)
	count(wrong) == 0
}
