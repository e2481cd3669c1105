/*
 * failinj.c - a preloaded library that makes thread creation or allocation
 * fail on demand, loaded ahead of the shim so the shim's own calls go
 * through it (and the program's, which is the control).
 *
 * FAILINJ: what fails: "thread" (pthread_create returns EAGAIN), "alloc"
 * (malloc, calloc and realloc return NULL with ENOMEM), or both,
 * comma-separated. FAILINJ_ARM: a path; calls fail only while that file
 * exists (checked on each call of a failing kind), so a program can start
 * up first and recover later. Without FAILINJ nothing fails.
 * The real functions are the next definitions (dlsym RTLD_NEXT: libc, or
 * a sanitizer's interceptors); allocations made while dlsym runs come
 * from a small static arena.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char arena[1 << 16] __attribute__((aligned(16)));
static size_t arena_used;
static __thread int resolving;

static void *(*next_malloc)(size_t);
static void *(*next_calloc)(size_t, size_t);
static void *(*next_realloc)(void *, size_t);
static void (*next_free)(void *);
static int (*next_create)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

/* Returns whether what ("thread", "alloc") fails now. */
static int failing(const char *what)
{
	const char *mode = getenv("FAILINJ"), *arm;

	if (!mode || !strstr(mode, what))
		return 0;
	arm = getenv("FAILINJ_ARM");
	return !arm || access(arm, F_OK) == 0;
}

static void *arena_get(size_t n)
{
	void *p;

	n = (n + 15) & ~(size_t)15;
	if (arena_used + n > sizeof(arena))
		return NULL;
	p = arena + arena_used;
	arena_used += n;
	return p;
}

static int in_arena(const void *p)
{
	return (const char *)p >= arena && (const char *)p < arena + sizeof(arena);
}

/* Finds the next allocator. Returns whether it is known: not while a
 * dlsym is running (a sanitizer's start-up looks its interceptors up
 * before this library's turn), which the arena serves meanwhile. */
static int resolve(void)
{
	if (next_free)
		return 1;
	if (resolving)
		return 0;
	resolving = 1;
	next_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
	next_calloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
	next_realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
	if (next_malloc && next_calloc && next_realloc)
		next_free = (void (*)(void *))dlsym(RTLD_NEXT, "free");
	resolving = 0;
	return next_free != NULL;
}

void *malloc(size_t n)
{
	if (!resolve())
		return arena_get(n);
	if (failing("alloc")) {
		errno = ENOMEM;
		return NULL;
	}
	return next_malloc(n);
}

void *calloc(size_t a, size_t b)
{
	if (!resolve())
		return arena_get(a * b); /* the arena is zeroed and never reused */
	if (failing("alloc")) {
		errno = ENOMEM;
		return NULL;
	}
	return next_calloc(a, b);
}

void *realloc(void *p, size_t n)
{
	void *q;

	if (!resolve())
		return NULL;
	if (failing("alloc")) {
		errno = ENOMEM;
		return NULL;
	}
	if (!in_arena(p))
		return next_realloc(p, n);
	q = next_malloc(n);
	if (q)
		memcpy(q, p, (size_t)(arena + sizeof(arena) - (char *)p) < n ?
		       (size_t)(arena + sizeof(arena) - (char *)p) : n);
	return q;
}

void free(void *p)
{
	if (!p || in_arena(p) || !resolve())
		return;
	next_free(p);
}

int pthread_create(pthread_t *th, const pthread_attr_t *a, void *(*fn)(void *), void *arg)
{
	if (failing("thread"))
		return EAGAIN;
	if (!next_create)
		next_create = (int (*)(pthread_t *, const pthread_attr_t *, void *(*)(void *),
				       void *))dlsym(RTLD_NEXT, "pthread_create");
	return next_create(th, a, fn, arg);
}
