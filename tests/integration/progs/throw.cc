// A C++ library whose guarded function throws through the shim.
#include <stdexcept>

extern "C" int may_throw(int x)
{
	if (x)
		throw std::runtime_error("boom");
	return 7;
}
