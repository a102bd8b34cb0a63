#!/usr/bin/env bash
# The gateway's part of a deployment folder, for docker-compose.yml's gateway service:
#
#   bash docker/gateway-init.sh DIR    (DIR made by `capgate deploy init DIR`)
#
# writes, next to the OPA token in DIR/gateway/ (all 0600, never overwritten):
#   mcp-token    a bearer token for one MCP client (256 random bits, URL-safe base64);
#   serve.yaml   capgate serve's configuration: the sales demo's tools, and that token's
#                SHA-256 bound to a sales agent of tenant acme quoting for contact c-42
#                (only the digest: the file gives nobody the token);
#   secrets.env  the connection secrets the tools get (CAPGATE_SECRET_ACME__CRM,
#                CAPGATE_SECRET_ACME__SALES_MAILBOX), random, for the demo's fake desk;
#   state.db     the gateway's store with tenant acme and its two connections
#                (made with `capgate tenants add` / `connections add`).
#
# It refuses a folder that already has any of them: a deployment's credentials are made
# once. $CAPGATE (default .venv/bin/capgate) is the capgate that makes the store.
set -euo pipefail

die() {
  echo "gateway-init: error: $*" >&2
  exit 2
}

[ $# = 1 ] || {
  echo "usage: $0 DEPLOYMENT_DIR" >&2
  exit 2
}
dir="$1/gateway"
capgate="${CAPGATE:-.venv/bin/capgate}"
[ -f "$dir/opa-token" ] || die "$dir/opa-token is missing: make the folder with 'capgate deploy init $1' first"
for name in mcp-token serve.yaml secrets.env state.db; do
  [ ! -e "$dir/$name" ] || die "$dir/$name exists: a deployment's credentials are never overwritten"
done
command -v "$capgate" >/dev/null || die "$capgate not found: run 'make setup', or set CAPGATE"

umask 077
random_token() { # 32 random bytes, URL-safe base64 without padding
  head -c 32 /dev/urandom | base64 -w0 | tr '+/' '-_' | tr -d '='
}

token="$(random_token)"
digest="$(printf '%s' "$token" | sha256sum)"
digest="${digest%% *}"
printf '%s\n' "$token" >"$dir/mcp-token"

cat >"$dir/serve.yaml" <<EOF
# capgate serve's configuration for docker-compose.yml's gateway, written by
# docker/gateway-init.sh. No secret: the MCP client's token is in mcp-token, only its
# SHA-256 is here.
tools: capgate.demo.tools.sales_desk:SalesDesk
credentials: environment
http:
  - name: demo-client
    token_sha256: $digest
    principal: {agent: sales-bot, role: sales, tenant: acme}
    task:
      type: customer_quote
      id: task-compose-1
      linked_resources: [{type: contact, id: c-42}]
    environment: production
EOF

# The variables capgate serve reads the secrets from (`credentials: environment`),
# as capgate names them: a tenant or alias that is not a plain lower-case name is
# escaped (docs/mcp-server.md), so a name written here by hand could be the wrong one.
crm="$("$capgate" connections variable acme crm)"
mailbox="$("$capgate" connections variable acme sales_mailbox)"
cat >"$dir/secrets.env" <<EOF
$crm=$(random_token)
$mailbox=$(random_token)
EOF

store="$dir/state.db"
"$capgate" tenants add acme --budget-class standard --store "$store" >/dev/null
"$capgate" connections add acme crm --account crm@acme.example --store "$store" >/dev/null
"$capgate" connections add acme sales_mailbox --account sales@acme.example \
  --store "$store" >/dev/null

echo "gateway files written to $dir"
echo "  MCP client token  $dir/mcp-token (0600: give it to the MCP client)"
echo "  serve config      $dir/serve.yaml (binds that token's digest to sales-bot of acme)"
echo "  secrets           $dir/secrets.env (0600: the connections' secrets)"
echo "  store             $store (tenant acme, connections crm and sales_mailbox)"
