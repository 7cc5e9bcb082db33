#!/usr/bin/env bash
# Prints the mirror the host's apt config names for Debian bookworm: the
# first URI of the stanza of /etc/apt/sources.list.d/debian.sources that
# carries the plain "bookworm" suite (not -security). Shared by
# scripts/incus-setup.sh and scripts/base-rootfs.sh, so that no registry host
# is written in this repository. Fails, saying so, when there is none.
set -euo pipefail
sources=/etc/apt/sources.list.d/debian.sources
uri=$(awk '
  /^[[:space:]]*$/ { if (uri != "" && main) { print uri; exit } uri=""; main=0; next }
  /^URIs:/   { uri=$2 }
  /^Suites:/ { for (i=2;i<=NF;i++) if ($i=="bookworm") main=1 }
  END        { if (uri != "" && main) print uri }
' "$sources" 2>/dev/null | head -n1)
[[ -n $uri ]] || { echo "no bookworm URI in $sources" >&2; exit 1; }
echo "$uri"
