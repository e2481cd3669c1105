/*
 * A library linked with -Wl,-Bsymbolic: lib_outer's call of the exported
 * lib_inner is bound at link time (a direct call, no relocation), so only
 * entry patching can guard lib_inner. entry_sym_main calls lib_outer only.
 */
__attribute__((noinline)) int lib_inner(int x)
{
	return x * 7 + 1;
}

int lib_outer(int x)
{
	return lib_inner(x) + lib_inner(x + 1);
}
