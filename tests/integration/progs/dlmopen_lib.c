/* SPDX-License-Identifier: MIT */
/*
 * libnsuser.so: linked with -lbiz; dlmopen_main loads it into a new
 * link-map namespace, where it calls that namespace's copy of libbiz.so.
 */
int biz_price(int x);
int biz_calls(void);

/* Calls biz_price through this library's PLT, inside its namespace. */
int ns_price(int x)
{
	return biz_price(x) + 5;
}

int ns_biz_calls(void)
{
	return biz_calls();
}
