/* SPDX-License-Identifier: MIT */
/*
 * dlmopen_main PATH: loads PATH (libnsuser.so) into a new link-map
 * namespace with dlmopen(LM_ID_NEWLM, RTLD_NOW): it and its dependencies
 * (libbiz.so, libc) get copies of their own there, and LD_PRELOAD does not
 * apply. Prints one line each:
 *   lmid 1             the namespace dlinfo reports for the handle
 *   ns_price 45        ns_price(4) through dlsym: libnsuser.so calls its
 *                      namespace's biz_price(4) through its own PLT, + 5
 *   dlsym 50           biz_price(5) through dlsym(handle, "biz_price"): the
 *                      new namespace's copy, called from the executable
 *   main 60            biz_price(6): the executable's own libbiz.so
 *   calls ns=2 main=1  how often each copy of biz_price ran
 * Exits 2 printing "dlmopen: <dlerror>" when the load fails, 3 when a
 * dlsym does.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

int biz_price(int x);
int biz_calls(void);

static void *sym(void *h, const char *name)
{
	void *p = dlsym(h, name);

	if (!p)
		printf("dlsym: %s\n", dlerror());
	return p;
}

int main(int argc, char **argv)
{
	int (*ns_price)(int), (*ns_biz)(int), (*ns_calls)(void);
	Lmid_t lmid = -1;
	void *h;

	if (argc < 2) {
		fprintf(stderr, "usage: dlmopen_main PATH\n");
		return 64;
	}
	h = dlmopen(LM_ID_NEWLM, argv[1], RTLD_NOW);
	if (!h) {
		printf("dlmopen: %s\n", dlerror());
		return 2;
	}
	if (dlinfo(h, RTLD_DI_LMID, &lmid) != 0 || !(*(void **)&ns_price = sym(h, "ns_price")) ||
	    !(*(void **)&ns_biz = sym(h, "biz_price")) ||
	    !(*(void **)&ns_calls = sym(h, "ns_biz_calls")))
		return 3;
	printf("lmid %ld\n", (long)lmid);
	printf("ns_price %d\n", ns_price(4));
	printf("dlsym %d\n", ns_biz(5));
	printf("main %d\n", biz_price(6));
	printf("calls ns=%d main=%d\n", ns_calls(), biz_calls());
	return 0;
}
