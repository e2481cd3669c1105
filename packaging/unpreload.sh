# shellcheck shell=sh
# unpreload.sh - lockshim_unpreload FILE LINE: removes every line of FILE
# (an ld.so.preload) that is exactly LINE, keeping the other lines, the
# file's mode and owner; prints what it removed. POSIX sh, coreutils and
# grep only (both essential in Debian). The rewrite is atomic: a temporary
# file beside FILE, then a rename, so no program ever reads half a file.
# A symbolic link is followed (the file it names is rewritten). A failure
# (a read-only /etc) fails the caller under set -e: better a removal that
# stops than a shim deleted under a preload line naming it.
# Sourced by `make uninstall`; `make deb` pastes it into the package's prerm
# and postrm in place of their #UNPRELOAD# line, so both remove the same way.
lockshim_unpreload() {
	_f=$1
	_line=$2
	[ -f "$_f" ] || return 0
	if [ -L "$_f" ]; then _f=$(readlink -f -- "$_f"); fi
	grep -qxF -- "$_line" "$_f" || return 0
	_tmp=$(mktemp "$_f.lockshim.XXXXXX")
	cp -p -- "$_f" "$_tmp"
	grep -vxF -- "$_line" "$_f" > "$_tmp" || [ $? -eq 1 ]
	mv -f -- "$_tmp" "$_f"
	echo "lockshim: removed $_line from $_f"
}
