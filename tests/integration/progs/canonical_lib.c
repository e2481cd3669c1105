/*
 * libcanonical.so: a library whose function canon_add the tests guard, and
 * two functions that call it from inside the library.
 *
 * Built -fPIC. When a non-PIE executable takes canon_add's address, its own
 * PLT entry becomes the function's canonical address: the library's GOT
 * slot for canon_add (GLOB_DAT, from taking the address here) then holds the
 * executable's PLT entry, while its PLT slot (JUMP_SLOT) holds the real
 * function.
 */
int canon_add(int x)
{
	return x + 1000;
}

/* Calls canon_add through the library's PLT (JUMP_SLOT). */
int lib_call_plt(int x)
{
	return canon_add(x) + 10000;
}

/* Takes canon_add's address through the library's GOT (GLOB_DAT) and calls
 * it through that pointer. */
int lib_call_got(int x)
{
	int (*volatile p)(int) = canon_add;

	return p(x) + 20000;
}
