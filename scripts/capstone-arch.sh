#!/bin/sh
# capstone-arch.sh ARCHIVE PREFIX OUT CC CFLAGS...
#
# Writes OUT, a copy of Debian's libcapstone.a with its core and the
# decoder of one architecture (the objects named PREFIX*, e.g. X86) only.
# cs.o's tables name every architecture's two entry points
# (<Arch>_global_init, <Arch>_option); for the architectures left out, a
# generated object defines them to refuse (CS_ERR_ARCH, CS_ERR_OPTION), so
# cs_open works for ours alone. The shim decodes one architecture; the
# others' tables (M68K's alone holds a megabyte of pointers) would be
# relocated in every process that loads the shim.
set -eu
archive=$1 keep=$2 out=$3 cc=$4
shift 4
dir=$out.d
rm -rf "$dir" && mkdir -p "$dir"
cd "$dir"
ar x "$archive"
arches=$(nm -u cs.o | sed -n 's/^ *U \(.*\)_global_init$/\1/p')
echo "$arches" | grep -qx "$keep" || { echo "capstone-arch.sh: no architecture $keep in $archive" >&2; exit 1; }
{
	echo '#include <capstone/capstone.h>'
	for a in $arches; do
		[ "$a" = "$keep" ] && continue
		rm -f "$a"[A-Z]*.o
		echo "cs_err ${a}_global_init(void *ud);"
		echo "cs_err ${a}_global_init(void *ud) { (void)ud; return CS_ERR_ARCH; }"
		echo "cs_err ${a}_option(void *h, int type, size_t value);"
		echo "cs_err ${a}_option(void *h, int type, size_t value) { (void)h; (void)type; (void)value; return CS_ERR_OPTION; }"
	done
} > arch-stubs.c
"$cc" "$@" -c arch-stubs.c -o arch-stubs.o
cd - >/dev/null
rm -f "$out"
ar rcs "$out" "$dir"/*.o
rm -rf "$dir"
