/*
 * Calls that reach an entry-patched function through a relocation too:
 * lib_calls_back calls exe_cb, defined (and exported, -rdynamic) in the
 * executable, through the PLT; lib_twice is called by the executable
 * through the PLT and a stored pointer. Each call must be wrapped once.
 */
int exe_cb(int x);

__attribute__((noinline)) int lib_twice(int x)
{
	return x * 2 + 1;
}

int lib_calls_back(int x)
{
	return exe_cb(x) + 1;
}
