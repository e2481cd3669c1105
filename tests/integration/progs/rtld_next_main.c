/* SPDX-License-Identifier: MIT */
/*
 * rtld_next_main: linked with -lwrap -lbiz, so its calls of biz_price and
 * umask reach libwrap.so's wrappers, which call the next definitions
 * (libbiz.so's, libc's) through dlsym(RTLD_NEXT). Prints one line each:
 *   biz_price 41         biz_price(4): libbiz's 4 * 10, plus libwrap's 1
 *   umask 22             the mask the first of two umask calls set (octal)
 *   calls wrap=3 biz=1   entries of libwrap's wrappers, runs of libbiz's
 */
#include <stdio.h>
#include <sys/stat.h>

int biz_price(int x);
int biz_calls(void);
int wrap_calls(void);

int main(void)
{
	printf("biz_price %d\n", biz_price(4));
	umask(022);
	printf("umask %o\n", (unsigned)umask(077));
	printf("calls wrap=%d biz=%d\n", wrap_calls(), biz_calls());
	return 0;
}
