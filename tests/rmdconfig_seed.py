"""The seed's RmdConfig manifest (rmd-operator's sample, /work/shared/samples/rmdconfig/rmdconfig.yaml), byte
for byte: it must keep applying unchanged (tests/unit and tests/e2e test_rmdconfig.py)."""

NFD = "feature.node.kubernetes.io/cpu-rdt.RDTL3CA"  # the node label it selects, as rmd-operator did

SEED = """apiVersion: intel.com/v1alpha1
kind: RmdConfig
metadata:
   name: "rmdconfig"
spec:
  rmdImage: rmd:latest
  rmdNodeSelector:
    "feature.node.kubernetes.io/cpu-rdt.RDTL3CA": "true"
  deployNodeAgent: false
"""
