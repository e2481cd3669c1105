/* SPDX-License-Identifier: MIT */
/*
 * libbiz.so: a library whose function biz_price the interposition tests
 * guard (test_interposition.py). It counts its own calls, so that a test
 * can tell how often this copy ran (after dlmopen, each link-map namespace
 * has a copy of its own).
 */
static int calls;

int biz_price(int x)
{
	calls++;
	return x * 10;
}

int biz_calls(void)
{
	return calls;
}
