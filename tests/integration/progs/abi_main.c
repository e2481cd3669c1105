/* Prints every result of abi.c exactly, so runs can be compared byte for byte. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

struct big { long a, b, c, d, e; };
struct pair { long a, b; };
struct dpair { double x, y; };
struct mixed { double d; long l; };

long many_ints(long, long, long, long, long, long, long, long, long);
double many_doubles(double, double, double, double, double, double, double, double,
		    double, double);
double mixed_args(int, double, long, float, long, double, long, long, long, double,
		  char, float);
double vmix(int n, ...);
struct big make_big(long);
long take_big(long, struct big, long);
struct pair make_pair(long);
struct dpair make_dpair(double);
struct mixed make_mixed(double, long);
long double ld_mul(long double, long double);
long double ld_stack(long double, long double, long double, int);
float fsum(float, float);
int set_errno(int);
long deep(long);

int main(void)
{
	struct big b = make_big(7);
	struct pair p = make_pair(11);
	struct dpair dp = make_dpair(3.25);
	struct mixed m = make_mixed(1.75, -9);
	int rc;

	printf("many_ints %ld\n", many_ints(1, 2, 3, 4, 5, 6, 7, 8, 9));
	printf("many_doubles %a\n", many_doubles(1.1, 2.2, 3.3, 4.4, 5.5, 6.6, 7.7, 8.8, 9.9, 10.1));
	printf("mixed_args %a\n", mixed_args(3, 0.5, 7, 1.25f, -2, 3.5, 10, 4, 6, 0.125, 'A', 0.5f));
	printf("vmix %a\n", vmix(3, 2L, 0.5, -3L, 1.25, 100L, 0.001));
	printf("make_big %ld %ld %ld %ld %ld\n", b.a, b.b, b.c, b.d, b.e);
	printf("take_big %ld\n", take_big(3, b, 5));
	printf("make_pair %ld %ld\n", p.a, p.b);
	printf("make_dpair %a %a\n", dp.x, dp.y);
	printf("make_mixed %a %ld\n", m.d, m.l);
	printf("ld_mul %La\n", ld_mul(1.5L, 3.0000000000000000001L));
	printf("ld_stack %La\n", ld_stack(1.0L, 2.5L, 4.0L, 3));
	printf("fsum %a\n", (double)fsum(1.5f, 2.25f));
	errno = 0;
	rc = set_errno(ERANGE);
	printf("set_errno %d %s\n", rc, strerror(errno));
	errno = EINTR;
	rc = (int)many_ints(0, 0, 0, 0, 0, 0, 0, 0, 0);
	printf("errno kept %d %s\n", rc, strerror(errno));
	printf("deep %ld\n", deep(100000));
	return 0;
}
