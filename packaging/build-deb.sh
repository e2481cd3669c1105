#!/bin/bash
# build-deb.sh BUILD VERSION OUT MAINTAINER - makes the Debian package OUT
# from BUILD, a build made with PREFIX=/usr and
# LIBDIR=/usr/lib/x86_64-linux-gnu/lockshim (so the CLI's compiled-in shim
# path is the package's). `make deb` runs it. It stages the package's tree
# in BUILD/pkg/root with its own install lines (Debian's layout differs from
# `make install`'s: a private lib dir, gzipped man pages and changelog,
# doc/examples), computes Depends with dpkg-shlibdeps from the two binaries
# (in BUILD/pkg, beside a minimal debian/control, which it wants), fills in
# packaging/deb/control and pastes packaging/unpreload.sh into the prerm and
# postrm, writes md5sums, then builds with dpkg-deb --root-owner-group (no
# fakeroot needed).
set -euo pipefail

build=$1 version=$2 out=$3 maintainer=$4
arch=amd64
libdir=/usr/lib/x86_64-linux-gnu/lockshim
doc=/usr/share/doc/lockshim
here=$(cd "$(dirname "$0")" && pwd)
work=$build/pkg
root=$work/root

for tool in dpkg-deb dpkg-shlibdeps; do
	command -v "$tool" >/dev/null || {
		echo "build-deb.sh: $tool is missing (apt-get install dpkg-dev)" >&2
		exit 1
	}
done
top=$(sed -n '1s/^lockshim (\([^)]*\)).*/\1/p' "$here/deb/changelog")
if [ "$top" != "$version" ]; then
	echo "build-deb.sh: packaging/deb/changelog's latest entry is $top, the Makefile's VERSION $version: add an entry" >&2
	exit 1
fi

umask 022
rm -rf "$work"
install -d "$root/DEBIAN" "$root/usr/bin" "$root$libdir" "$root/usr/share/man/man1" \
	"$root/usr/share/man/man5" "$root$doc/examples" "$root/etc/lockshim"
install -m 0755 "$build/lockshim" "$root/usr/bin/lockshim"
install -m 0644 "$build/liblockshim.so" "$root$libdir/liblockshim.so"
# The backend modules, beside the shim (it opens them from its own
# directory). Not given to dpkg-shlibdeps: their client libraries (libpq5,
# libzookeeper-mt2, libcurl4 and libjson-c5) are Suggests, needed only by a
# config that selects that backend.
for mod in "$build"/liblockshim-*.so; do
	[ -e "$mod" ] || continue
	install -m 0644 "$mod" "$root$libdir/${mod##*/}"
	strip --remove-section=.comment --remove-section=.note --strip-unneeded \
		"$root$libdir/${mod##*/}"
done
# As dh_strip does: debug symbols out, the dynamic symbol table kept.
strip --remove-section=.comment --remove-section=.note "$root/usr/bin/lockshim"
strip --remove-section=.comment --remove-section=.note --strip-unneeded \
	"$root$libdir/liblockshim.so"
for page in lockshim.1:man1 lockshim.cfg.5:man5; do
	gzip -9n < "$build/man/${page%:*}" > "$root/usr/share/man/${page#*:}/${page%:*}.gz"
done
install -m 0644 config/lockshim.cfg "$root$doc/examples/lockshim.cfg"
install -m 0644 "$here/deb/copyright" "$root$doc/copyright"
# A native package (the version has no Debian revision): changelog.gz.
gzip -9n < "$here/deb/changelog" > "$root$doc/changelog.gz"
install -d "$root/usr/share/lintian/overrides"
install -m 0644 "$here/deb/lintian-overrides" "$root/usr/share/lintian/overrides/lockshim"
install -m 0644 config/lockshim.etc.cfg "$root/etc/lockshim/lockshim.cfg"
install -m 0644 "$here/deb/conffiles" "$root/DEBIAN/conffiles"
for script in prerm postrm; do
	sed -e "/^#UNPRELOAD#\$/{r $here/unpreload.sh" -e 'd}' "$here/deb/$script" \
		> "$root/DEBIAN/$script"
	chmod 0755 "$root/DEBIAN/$script"
done

mkdir -p "$work/debian"
printf 'Source: lockshim\n\nPackage: lockshim\nArchitecture: any\n' > "$work/debian/control"
depends=$(cd "$work" && dpkg-shlibdeps -O "root/usr/bin/lockshim" "root$libdir/liblockshim.so" |
	sed -n 's/^shlibs:Depends=//p')
[ -n "$depends" ] || { echo "build-deb.sh: dpkg-shlibdeps found no dependency" >&2; exit 1; }
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@MAINTAINER@/$maintainer/" \
	-e "s/@SIZE@/$size/" -e "s/@DEPENDS@/$depends/" "$here/deb/control" > "$root/DEBIAN/control"

# md5sums of every file but the conffile, as dh_md5sums writes them.
(cd "$root" && find usr -type f -print0 | LC_ALL=C sort -z | xargs -0 md5sum) > "$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/md5sums"
# md5sums of every file but the conffile, as dh_md5sums writes them.
(cd "$root" && find usr -type f -print0 | LC_ALL=C sort -z | xargs -0 md5sum) > "$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/md5sums"
dpkg-deb --root-owner-group -Zxz --build "$root" "$out" >/dev/null
echo "built $out (Depends: $depends)"
