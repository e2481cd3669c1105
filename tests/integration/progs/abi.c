/* Functions of every calling-convention shape the trampoline must carry. */
#include <errno.h>
#include <stdarg.h>

struct big { long a, b, c, d, e; };   /* returned and passed in memory */
struct pair { long a, b; };           /* rax:rdx */
struct dpair { double x, y; };        /* xmm0:xmm1 */
struct mixed { double d; long l; };   /* xmm0 + rax */

long many_ints(long a, long b, long c, long d, long e, long f, long g, long h, long i)
{
	return a + 2 * b + 3 * c + 5 * d + 7 * e + 11 * f + 13 * g + 17 * h + 19 * i;
}

double many_doubles(double a, double b, double c, double d, double e, double f,
		    double g, double h, double i, double j)
{
	return a + b / 2 + c / 3 + d / 5 + e / 7 + f / 11 + g / 13 + h / 17 + i / 19 + j / 23;
}

double mixed_args(int a, double b, long c, float d, long e, double f, long g,
		  long h, long i, double j, char k, float l)
{
	return a * b + (double)c * d + (double)e * f + (double)(g - h + i) * j + k * l;
}

double vmix(int n, ...)
{
	va_list ap;
	double s = 0;

	va_start(ap, n);
	for (int i = 0; i < n; i++) {
		long l = va_arg(ap, long);
		double d = va_arg(ap, double);

		s += (double)l * d;
	}
	va_end(ap);
	return s;
}

struct big make_big(long seed)
{
	struct big b = { seed, seed * 2, seed * 3, seed * 4, seed * 5 };
	return b;
}

long take_big(long k, struct big b, long m)
{
	return k * (b.a + b.b + b.c + b.d + b.e) + m;
}

struct pair make_pair(long a)
{
	struct pair p = { a, -a * 3 };
	return p;
}

struct dpair make_dpair(double a)
{
	struct dpair p = { a * 1.5, a / 4 };
	return p;
}

struct mixed make_mixed(double d, long l)
{
	struct mixed m = { d * 2, l * 2 };
	return m;
}

long double ld_mul(long double a, long double b)
{
	return a * b;
}

long double ld_stack(long double a, long double b, long double c, int x)
{
	return a + b * c + x;
}

float fsum(float a, float b)
{
	return a + b;
}

int set_errno(int e)
{
	errno = e;
	return -1;
}

static long down(long n)
{
	volatile char pad[48];

	pad[0] = (char)n;
	return n == 0 ? pad[0] : 1 + down(n - 1);
}

long deep(long n)
{
	return down(n);
}
