"""The contract for agents' serving certificates issued through the Kubernetes CSR API: each agent asks for a
certificate valid for its own node's name only, and the operator signs what passes its checks
(docs/security.md, "Each agent's serving certificate")."""

SIGNER_NAME = "intel.com/rmd-agent-serving"
# What an agent asks for and the signer allows: a serving certificate, nothing that could act as a client.
USAGES = ("digital signature", "server auth")
# Where the API server puts the node of the pod a service-account token is bound to (CSR spec.extra).
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
# The node an agent's request is for, in the CSR's annotations: the chart's admission policy admits an agent's
# request only if this is the node of its token (it cannot read the PEM; the operator checks the names in it).
NODE_ANNOTATION = "rmd-agent.intel.com/node"
DEFAULT_EXPIRATION_SECONDS = 7 * 24 * 3600
MIN_EXPIRATION_SECONDS = 600  # the CSR API's own minimum
