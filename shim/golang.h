/* SPDX-License-Identifier: MIT */
/*
 * golang.h - Go executables, for the start-up report.
 *
 * A Go program makes its system calls itself, not through libc: a lock on
 * a libc function can catch only its cgo calls (the C code it is linked
 * with). redirect.c's report asks golang_why about every lock; golang.c
 * recognises the executable once, by the build information the Go linker
 * writes into it.
 */
#ifndef LOCKSHIM_GOLANG_H
#define LOCKSHIM_GOLANG_H

#include <stddef.h>

enum golang_verdict {
	GOLANG_NOT = 0,   /* not a Go executable, or name is not libc's */
	GOLANG_CGO_ONLY,  /* guarded, but only at the cgo call sites that exist */
	GOLANG_UNGUARDED, /* a Go executable, and no cgo call site of name */
};

/*
 * For a lock on name in this process: when the executable is a Go program
 * and libc defines name, writes into why (len bytes, NUL-terminated) one
 * line that says so and returns GOLANG_CGO_ONLY when the executable (its
 * cgo code) or a C library it links, libc aside, has a relocation for
 * name, which relocation or entry patching guards, else
 * GOLANG_UNGUARDED (why then begins with name). Returns GOLANG_NOT, why
 * untouched, otherwise. Called at start-up only (the first call looks at
 * the executable; nothing is allocated).
 */
int golang_why(const char *name, char *why, size_t len);

#endif
