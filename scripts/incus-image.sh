# Sourced by scripts/incus-setup.sh and scripts/incus-cluster.sh: the host
# Incus's image of a cached unified tarball, under an alias.

# image_fingerprint ALIAS: the fingerprint ALIAS names, or nothing.
image_fingerprint() {
  incus image info "$1" 2>/dev/null | awk '/^Fingerprint:/ {print $2}' || true
}

# point_alias TARBALL FINGERPRINT ALIAS: makes ALIAS name the image of
# TARBALL (whose sha256 is FINGERPRINT): an alias of it when Incus holds it
# already, an import otherwise. The image ALIAS named before is deleted
# (instances cloned from it keep their roots: a btrfs snapshot does not
# depend on its source).
point_alias() {
  local tarball=$1 want=$2 alias=$3 have
  have=$(image_fingerprint "$alias")
  if [[ -n $have ]]; then incus image alias delete "$alias"; fi
  if incus image info "$want" >/dev/null 2>&1; then
    incus image alias create "$alias" "$want"
  else
    incus image import "$tarball" --alias "$alias" >/dev/null
  fi
  if [[ -n $have && $have != "$want" ]]; then incus image delete "$have" 2>/dev/null || true; fi
}
