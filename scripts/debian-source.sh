# Sourced (not run) by the scripts that rebuild a Debian library from
# Debian's own source package: scripts/tsan-abseil.sh (abseil for TSan) and
# scripts/pic-deps.sh (abseil and protobuf as static -fPIC archives for
# libkvtier.so). Both build exactly the version that is installed, so the
# headers in /usr/include, which the project compiles against, are the
# headers of what they build.
#
#   debian_pinned_version TAG BINARY_PACKAGE PINNED_VERSION
#     Checks that BINARY_PACKAGE is installed at PINNED_VERSION; otherwise
#     says so (prefixed by TAG, the calling script's name) and exits 1.
#
#   debian_source_unpack TAG SOURCE VERSION DSC_SHA256 DL_DIR DEST
#     Downloads SOURCE_VERSION.dsc and the files it lists into DL_DIR (kept
#     there, so a rerun downloads nothing), checks the .dsc against the pinned
#     DSC_SHA256 and every file it lists against the .dsc's own SHA-256, and
#     unpacks the source with Debian's patches applied into DEST (replaced).
#     The .dsc's PGP signature is not checked (it is the uploader's, not the
#     archive's key): the pin is the trust anchor.
#
# Mirror: $DEBIAN_MIRROR, default http://deb.debian.org/debian. Once Debian
# ships a newer point release the old version leaves that pool; point
# DEBIAN_MIRROR at a snapshot (https://snapshot.debian.org/archive/debian/
# <timestamp>) or update the pins. Needs curl, sha256sum and dpkg-source.

debian_pinned_version() {
  local tag=$1 package=$2 pinned=$3 installed
  installed=$(dpkg-query -W -f='${Version}' "$package" 2>/dev/null) || {
    echo "$tag: $package is not installed (make deps)" >&2
    exit 1
  }
  if [ "$installed" != "$pinned" ]; then
    echo "$tag: $package is $installed, the script knows $pinned:" \
      "update its pinned version and the sha256 of the source package's" \
      ".dsc" >&2
    exit 1
  fi
}

debian_source_unpack() {
  local tag=$1 source=$2 version=$3 dsc_sha256=$4 dl=$5 dest=$6
  local mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
  local pool dsc f sum files=()
  # Debian's pool: lib* sources under their first four letters.
  case "$source" in
    lib?*) pool=${source:0:4} ;;
    *) pool=${source:0:1} ;;
  esac
  pool=$mirror/pool/main/$pool/$source
  dsc=${source}_${version}.dsc
  mkdir -p "$dl"
  _debian_fetch "$tag" "$pool/$dsc" "$dl/$dsc"
  if ! echo "$dsc_sha256  $dl/$dsc" | sha256sum --quiet -c - 2>/dev/null; then
    echo "$tag: $dl/$dsc does not match its pinned sha256" \
      "$dsc_sha256" >&2
    rm -f "$dl/$dsc"
    exit 1
  fi
  # The files the .dsc lists under Checksums-Sha256 (" sum size name").
  while read -r sum _ f; do
    _debian_fetch "$tag" "$pool/$f" "$dl/$f"
    if ! echo "$sum  $dl/$f" | sha256sum --quiet -c - 2>/dev/null; then
      echo "$tag: $dl/$f does not match the sha256 in $dsc" >&2
      rm -f "$dl/$f"
      exit 1
    fi
    files+=("$f")
  done < <(sed -n '/^Checksums-Sha256:/,/^[^ ]/{/^ /p}' "$dl/$dsc")
  rm -rf "$dest"
  mkdir -p "$(dirname "$dest")"
  # --no-check: the checksums were verified above; it also skips the
  # signature check, which would only warn for want of the uploader's key.
  dpkg-source --no-check -x "$dl/$dsc" "$dest" >/dev/null
  # dpkg-source leaves copies of the tarballs beside DEST.
  if [ "$(cd "$(dirname "$dest")" && pwd)" != "$(cd "$dl" && pwd)" ]; then
    for f in "${files[@]}"; do rm -f "$(dirname "$dest")/$f"; done
  fi
}

_debian_fetch() {
  local tag=$1 url=$2 file=$3
  [ -s "$file" ] && return 0
  if ! curl -sSfL -o "$file.part" "$url"; then
    echo "$tag: cannot download $url (set DEBIAN_MIRROR to a mirror or" \
      "snapshot that has it)" >&2
    rm -f "$file.part"
    exit 1
  fi
  mv "$file.part" "$file"
}
