"""Generated from crds/*.yaml by tools/sync_chart_crds.py: do not edit (CI checks it).

What `rmdctl validate` expects of each CRD of this release: its storage version and, per served version,
the digest of its schema (rmd_operator.validate.crd_schema.schema_digest)."""

from __future__ import annotations

# CRD name -> (storage version, {served version: schema digest})
EXPECTED_CRDS: dict[str, tuple[str, dict[str, str]]] = {
    "nodeconfigs.wao.bitmedia.co.jp": ("v1beta1", {"v1beta1": "c6f06ca094f800f6"}),
    "nodeconfigtemplates.wao.bitmedia.co.jp": ("v1beta1", {"v1beta1": "6a7509e15020ed7a"}),
    "noderesourcetopologies.topology.node.k8s.io": ("v1alpha2", {"v1alpha2": "9e0fee400f94d812"}),
    "rmdconfigs.intel.com": ("v1alpha1", {"v1alpha1": "f768b2ed9e12da7e"}),
    "rmdnodestates.intel.com": ("v1alpha1", {"v1alpha1": "94038f65adc67f18"}),
    "rmdworkloads.intel.com": ("v1alpha1", {"v1alpha1": "bc1319147ac25c15"}),
}
