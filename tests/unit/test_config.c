/* SPDX-License-Identifier: MIT */
/* Unit tests for conf.c: defaults, inheritance, validation messages. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend_local_conf.h"
#include "backend_redis_conf.h"
#include "conf.h"
#include "conf_field.h"
#include "settings.h"
#include "test.h"

/* The groups the shim registers (backend.c), without linking the backends. */
static const struct conf_group *const groups[] = { &backend_redis_settings, NULL };

/* The settings of the redis group of a loaded struct conf. */
#define REDIS(c) ((const struct redis_spec *)conf_group_data(&(c), &backend_redis_settings))

static char path[] = "/tmp/lockshim-test-XXXXXX.cfg";

static int load_text(struct conf *cfg, const char *text, char *err, size_t errlen)
{
	FILE *f = fopen(path, "w");

	fputs(text, f);
	fclose(f);
	return conf_load(cfg, path, groups, err, errlen);
}

/* Returns 1 when text fails to load with a message containing every needle
 * (a NULL-terminated list) and the file name. */
static int rejects(const char *text, const char *n1, const char *n2)
{
	struct conf cfg;
	char err[768] = "";
	int rc = load_text(&cfg, text, err, sizeof(err));

	conf_release(&cfg);
	if (rc == 0 || !strstr(err, path) || !strstr(err, n1) || (n2 && !strstr(err, n2))) {
		fprintf(stderr, "  message was: %s\n", err);
		return 0;
	}
	return 1;
}

static const char *str_or(const char *s) { return s ? s : "(null)"; }

/* Writes every value conf_load produced, for comparing two loads. */
static void dump(const struct conf *cfg, char *buf, size_t len)
{
	const struct redis_spec *r = REDIS(*cfg);
	size_t n;

	n = (size_t)snprintf(buf, len, "%s %d %s %s %s %d %d %d %d %d %d|%s %d %s %d|%d", r->host,
			     r->port, str_or(r->socket), str_or(r->password), str_or(r->username),
			     r->db, r->connect_timeout_ms, r->command_timeout_ms, r->wait_replicas,
			     r->wait_replicas_ms, r->tls.verify, cfg->ns, cfg->log_level,
			     str_or(cfg->log_file), cfg->strict, cfg->nlocks);
	n += (size_t)snprintf(buf + n, len - n, "|log %d %d", cfg->log_format, cfg->log_syslog);
	for (int i = 0; i < cfg->nlocks && n < len; i++) {
		const struct lock_spec *l = &cfg->locks[i];

		n += (size_t)snprintf(buf + n, len - n,
			"|%s %s %s %lld %lld %lld %lld %lld %lld %lld %lld %a %d %d %d %d %d %d %d "
			"%d %d %d %d %d %d %lld %d %d", l->symbol, l->key_src, l->key.prefix, l->lease_ms,
			l->wait_ms, l->max_hold_ms, l->kill_grace_ms, l->retry_max_ms,
			l->handoff_us, l->linger_ms, l->ret, l->ret_double, l->err, l->exit_code,
			l->kill_signal, l->on_timeout, l->on_error, l->on_lost, l->on_overrun,
			l->reentrant, l->fair, l->break_dead, l->strict, l->stack_args_bytes,
			l->index, l->waiter_ttl_ms, l->limit, l->shared);
		if (n < len)
			n += (size_t)snprintf(buf + n, len - n, " warn %lld", l->warn_wait_ms);
	}
}

/* Writes a config of one lock with "name = value;" in group (top, redis or
 * lock); without name, the same config without the setting. */
static void config_with(char *buf, size_t len, const char *group, const char *name,
			const char *value)
{
	char set[256] = "", tls[300] = "";

	if (name)
		snprintf(set, sizeof(set), "%s = %s;", name, value);
	if (!strcmp(group, "tls"))
		snprintf(tls, sizeof(tls), "tls = { %s };", set);
	snprintf(buf, len, "%s\nredis = { %s %s };\nlocks = ( { symbol = \"f\"; %s } );\n",
		 !strcmp(group, "top") ? set : "", !strcmp(group, "redis") ? set : "", tls,
		 !strcmp(group, "lock") ? set : "");
}

/* conf_open_trusted on files in a fresh 0755 directory: as root in /run
 * (every directory from / root's alone), refusals and acceptance; else in
 * /tmp (sticky, writable by all), where everything is refused. */
static void open_trusted(void)
{
	char run[] = "/run/lockshim-trust-XXXXXX", tmp[] = "/tmp/lockshim-trust-XXXXXX";
	char file[64], link[64], sub[64], why[512], *dir;
	int ok, fd;

	ok = geteuid() == 0 && mkdtemp(run) != NULL;
	if (!(dir = ok ? run : mkdtemp(tmp)))
		return;
	chmod(dir, 0755);
	snprintf(file, sizeof(file), "%s/f", dir);
	snprintf(link, sizeof(link), "%s/l", dir);
	close(open(file, O_WRONLY | O_CREAT, 0644));
	symlink("f", link);

	test("conf_open_trusted: a relative path, a directory name");
	test_cond(conf_open_trusted("f", O_RDONLY, 0, 1, why, sizeof(why)) == CONF_UNTRUSTED &&
		  strstr(why, "absolute"));
	test_cond(conf_open_trusted("/run/", O_RDONLY, 0, 1, why, sizeof(why)) == CONF_UNTRUSTED);

	test("conf_open_trusted: root's file below root's directories (as root)");
	fd = conf_open_trusted(file, O_RDONLY, 0, 1, why, sizeof(why));
	test_cond(ok ? fd >= 0 : fd == CONF_UNTRUSTED);
	if (fd >= 0)
		test_cond(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	if (fd >= 0)
		close(fd);

	test("conf_open_trusted: a symbolic link, a missing file, a linked directory");
	test_cond(conf_open_trusted(link, O_RDONLY, 0, 1, why, sizeof(why)) == CONF_UNTRUSTED &&
		  (!ok || strstr(why, "symbolic link")));
	unlink(link);
	test_cond(conf_open_trusted(link, O_RDONLY, 0, 1, why, sizeof(why)) == (ok ? -1 : CONF_UNTRUSTED));
	symlink(".", link);
	snprintf(sub, sizeof(sub), "%s/l/f", dir);
	test_cond(conf_open_trusted(sub, O_RDONLY, 0, 1, why, sizeof(why)) == CONF_UNTRUSTED &&
		  (!ok || (strstr(why, "symbolic link") && strstr(why, link))));
	unlink(link);

	test("conf_open_trusted: a file writable by group or others (unless !file_too)");
	chmod(file, 0664);
	test_cond(conf_open_trusted(file, O_RDONLY, 0, 1, why, sizeof(why)) == CONF_UNTRUSTED &&
		  (!ok || strstr(why, "mode 0664")));
	fd = conf_open_trusted(file, O_WRONLY | O_APPEND, 0, 0, why, sizeof(why));
	test_cond(ok ? fd >= 0 : fd == CONF_UNTRUSTED);
	if (fd >= 0)
		close(fd);

	test("conf_open_trusted: a directory writable by others, even sticky; /tmp");
	chmod(dir, 01777);
	test_cond(conf_open_trusted(file, O_WRONLY | O_APPEND, 0, 0, why, sizeof(why)) ==
		  CONF_UNTRUSTED && strstr(why, "mode 1777") && strstr(why, ok ? dir : "/tmp"));
	unlink(file);
	rmdir(dir);
}

/* conf_keep_locks's filter: the specs of symbols h and i. */
/* The local backend's decision on its dir's filesystem (statfs's f_type):
 * remote ones (inotify blind to other hosts, locks a server's) refused,
 * local ones taken. A mount of each is not possible here. */
static void remote_filesystems(void)
{
	test("local: remote filesystems by statfs magic");
	test_cond(strcmp(local_fs_remote(0x6969), "NFS") == 0);
	test_cond(strcmp(local_fs_remote(0xFF534D42), "CIFS") == 0);
	test_cond(strcmp(local_fs_remote((long)(int)0xFF534D42), "CIFS") == 0); /* sign-extended */
	test_cond(strcmp(local_fs_remote(0xFE534D42), "SMB2") == 0);
	test_cond(strcmp(local_fs_remote(0x65735546), "FUSE") == 0);
	test_cond(strcmp(local_fs_remote(0x00C36400), "Ceph") == 0);
	test_cond(local_fs_remote(0xEF53) == NULL);     /* ext4 */
	test_cond(local_fs_remote(0x01021994) == NULL); /* tmpfs */
	test_cond(local_fs_remote(0x58465342) == NULL); /* XFS */
	test_cond(local_fs_remote(0x9123683E) == NULL); /* Btrfs */
	test_cond(local_fs_remote(0x794C7630) == NULL); /* overlayfs (containers) */
}

static int keep_h_and_i(const struct lock_spec *l, void *arg)
{
	(void)arg;
	return !strcmp(l->symbol, "h") || !strcmp(l->symbol, "i");
}

int main(void)
{
	struct conf cfg;
	char err[768];
	int fd = mkstemps(path, 4);

	close(fd);
	test("built-in defaults");
	test_cond(load_text(&cfg, "locks = ( { symbol = \"f\"; } );", err, sizeof(err)) == 0);
	test_cond(cfg.nlocks == 1);
	test_cond(strcmp(cfg.ns, "lockshim") == 0);
	test_cond(strcmp(REDIS(cfg)->host, "127.0.0.1") == 0 && REDIS(cfg)->port == 6379);
	test_cond(REDIS(cfg)->connect_timeout_ms == 500 && REDIS(cfg)->command_timeout_ms == 500);
	test_cond(cfg.log_level == -1);
	{
		const struct lock_spec *l = conf_find(&cfg, "f");

		test_cond(l && strcmp(l->key_src, "{symbol}") == 0);
		test_cond(l->lease_ms == 30000 && l->wait_ms == 10000);
		test_cond(l->on_timeout == POLICY_SKIP && l->on_error == POLICY_SKIP);
		test_cond(l->ret == -1 && l->ret_double == -1.0 && l->err == EBUSY);
		test_cond(l->exit_code == 75 && l->on_lost == HOLD_LOG);
		test_cond(l->max_hold_ms == 0 && l->on_overrun == HOLD_LOG);
		test_cond(l->kill_signal == SIGTERM && l->kill_grace_ms == 5000);
		test_cond(l->reentrant == 1 && l->stack_args_bytes == 256);
		test_cond(l->fair == 0 && l->handoff_us == 500 && l->linger_ms == 1);
		test_cond(l->limit == 1 && l->shared == 0);
	}
	conf_release(&cfg);

	test("defaults group, overrides, on_error follows on_timeout");
	test_cond(load_text(&cfg,
		"redis = { socket = \"/tmp/r.sock\"; password = \"pw\"; username = \"u\"; db = 3;"
		"          connect_timeout_ms = 100; command_timeout_ms = 200; };\n"
		"namespace = \"prod\"; log_level = \"debug\";\n"
		"defaults = { lease_ms = 900; on_timeout = \"exit\"; key = \"{symbol}:{arg0}\"; };\n"
		"locks = ( { symbol = \"a\"; },\n"
		"          { symbol = \"b\"; on_error = \"proceed\"; errno = \"EAGAIN\";\n"
		"            kill_signal = \"SIGUSR1\"; return = 2.5; reentrant = false;\n"
		"            wait_ms = -1; key = \"k\"; stack_args_bytes = 40; } );\n",
		err, sizeof(err)) == 0);
	test_cond(strcmp(REDIS(cfg)->socket, "/tmp/r.sock") == 0 && REDIS(cfg)->db == 3);
	test_cond(strcmp(REDIS(cfg)->username, "u") == 0);
	test_cond(REDIS(cfg)->connect_timeout_ms == 100 && REDIS(cfg)->command_timeout_ms == 200);
	test_cond(cfg.log_level == 3 && strcmp(cfg.ns, "prod") == 0);
	test_cond(cfg.locks[0].lease_ms == 900 && cfg.locks[0].on_timeout == POLICY_EXIT);
	test_cond(cfg.locks[0].on_error == POLICY_EXIT);
	test_cond(strcmp(cfg.locks[0].key_src, "{symbol}:{arg0}") == 0);
	test_cond(cfg.locks[1].on_error == POLICY_PROCEED && cfg.locks[1].err == EAGAIN);
	test_cond(cfg.locks[1].kill_signal == SIGUSR1 && cfg.locks[1].reentrant == 0);
	test_cond(cfg.locks[1].ret == 2 && cfg.locks[1].ret_double == 2.5);
	test_cond(cfg.locks[1].wait_ms == -1 && cfg.locks[1].stack_args_bytes == 48);
	test_cond(strcmp(cfg.locks[1].key.prefix, "prod:") == 0);
	conf_release(&cfg);

	test("handoff_ms takes whole or decimal milliseconds");
	test_cond(load_text(&cfg, "locks = ( { symbol = \"a\"; handoff_ms = 2; linger_ms = 0; },\n"
			    "          { symbol = \"b\"; handoff_ms = 0.25; } );", err,
			    sizeof(err)) == 0);
	test_cond(cfg.locks[0].handoff_us == 2000 && cfg.locks[0].linger_ms == 0);
	test_cond(cfg.locks[1].handoff_us == 250);
	conf_release(&cfg);
	test_cond(rejects("locks = ( { symbol = \"f\"; handoff_ms = -0.5; } );", "handoff_ms",
			  "out of range"));
	test_cond(rejects("locks = ( { symbol = \"f\"; handoff_ms = \"1\"; } );", "handoff_ms",
			  "expected a number"));
	test_cond(rejects("locks = ( { symbol = \"f\"; linger_ms = 0.5; } );", "linger_ms",
			  "expected an integer"));

	test("every per-lock setting round-trips into its own member only");
	/* err, exit_code, kill_signal, on_*, reentrant, fair, break_dead,
	 * strict and stack_args_bytes are adjacent ints: each is written with
	 * its own size, so setting one never changes its neighbours. The
	 * settings are given in an order where a wider write would clobber
	 * an already written neighbour. */
	test_cond(load_text(&cfg,
		"locks = ( { stack_args_bytes = 65536; strict = true; break_dead_holders = false;\n"
		"            fair = true; limit = 10000; reentrant = false; on_overrun = \"abort\";\n"
		"            on_lost = \"kill\"; on_error = \"exit\"; on_timeout = \"proceed\";\n"
		"            kill_signal = 9; exit_code = 255; errno = 4095;\n"
		"            return = -7; linger_ms = 60000; handoff_ms = 60000;\n"
		"            retry_max_ms = 60000; kill_grace_ms = 12345; max_hold_ms = 777;\n"
		"            wait_ms = 0; lease_ms = 2147483647; key = \"k{arg0}\";\n"
		"            symbol = \"f\"; } );", err, sizeof(err)) == 0);
	{
		const struct lock_spec *l = &cfg.locks[0];

		test_cond(strcmp(l->symbol, "f") == 0 && strcmp(l->key_src, "k{arg0}") == 0);
		test_cond(l->lease_ms == 2147483647 && l->wait_ms == 0);
		test_cond(l->max_hold_ms == 777 && l->kill_grace_ms == 12345);
		test_cond(l->retry_max_ms == 60000 && l->handoff_us == 60000000);
		test_cond(l->linger_ms == 60000);
		test_cond(l->ret == -7 && l->ret_double == -7.0);
		test_cond(l->err == 4095 && l->exit_code == 255 && l->kill_signal == 9);
		test_cond(l->on_timeout == POLICY_PROCEED && l->on_error == POLICY_EXIT);
		test_cond(l->on_lost == HOLD_KILL && l->on_overrun == HOLD_ABORT);
		test_cond(l->reentrant == 0 && l->fair == 1 && l->break_dead == 0);
		test_cond(l->strict == 1 && l->stack_args_bytes == 65536 && l->index == 0);
		test_cond(l->limit == 10000 && l->shared == 0);
	}
	conf_release(&cfg);

	test("limit and mode: a semaphore, a shared lock, never both");
	test_cond(load_text(&cfg, "defaults = { mode = \"shared\"; };\n"
			    "locks = ( { symbol = \"a\"; }, { symbol = \"b\"; mode = \"exclusive\";\n"
			    "            limit = 3; } );", err, sizeof(err)) == 0);
	test_cond(cfg.locks[0].shared == 1 && cfg.locks[0].limit == 1);
	test_cond(cfg.locks[1].shared == 0 && cfg.locks[1].limit == 3);
	conf_release(&cfg);
	test_cond(rejects("locks = ( { symbol = \"f\"; limit = 0; } );", "limit", "out of range"));
	test_cond(rejects("locks = ( { symbol = \"f\"; limit = 10001; } );", "limit",
			  "out of range"));
	test_cond(rejects("locks = ( { symbol = \"f\"; mode = \"read\"; } );", "mode",
			  "unknown value"));
	test_cond(rejects("locks = ( { symbol = \"f\"; mode = \"shared\"; limit = 2; } );",
			  "locks[0].mode", "limit = 2"));
	test_cond(rejects("defaults = { mode = \"shared\"; limit = 2; };", "defaults.mode",
			  "limit = 2"));
	test_cond(rejects("redis = { masters = ( { host = \"a\"; }, { host = \"b\"; },\n"
			  "{ host = \"c\"; } ); };\nlocks = ( { symbol = \"f\"; limit = 2; } );",
			  "locks[0]", "Redlock"));
	/* The same neighbours, each set alone to its extreme: the others keep
	 * their defaults. */
	test_cond(load_text(&cfg,
		"locks = ( { symbol = \"a\"; exit_code = 0; },\n"
		"          { symbol = \"b\"; stack_args_bytes = 0; },\n"
		"          { symbol = \"c\"; kill_signal = \"SIGKILL\"; errno = 0; } );",
		err, sizeof(err)) == 0);
	test_cond(cfg.locks[0].exit_code == 0 && cfg.locks[0].err == EBUSY);
	test_cond(cfg.locks[0].kill_signal == SIGTERM);
	test_cond(cfg.locks[1].stack_args_bytes == 0 && cfg.locks[1].strict == 0);
	test_cond(cfg.locks[1].index == 1);
	test_cond(cfg.locks[2].kill_signal == SIGKILL && cfg.locks[2].err == 0);
	test_cond(cfg.locks[2].exit_code == 75 && cfg.locks[2].on_timeout == POLICY_SKIP);
	conf_release(&cfg);

	test("production Redis: sentinels, replica acknowledgement, TLS, password sources");
	test_cond(load_text(&cfg,
		"redis = { tls = { verify = false; server_name = \"r.internal\"; key_file = \"/k\";\n"
		"                  cert_file = \"/c\"; ca_dir = \"/d\"; ca_file = \"/a\"; };\n"
		"          wait_replicas_ms = 600000; wait_replicas = 64; sentinel_password = \"sp\";\n"
		"          sentinel_username = \"su\"; master_name = \"locks\";\n"
		"          sentinels = ( \"10.0.0.5:26379\", \"[::1]:26380\" ); };",
		err, sizeof(err)) == 0);
	test_cond(!strcmp(REDIS(cfg)->sentinels[0], "10.0.0.5:26379") &&
		  !strcmp(REDIS(cfg)->sentinels[1], "[::1]:26380") && !REDIS(cfg)->sentinels[2]);
	test_cond(!strcmp(REDIS(cfg)->master_name, "locks") &&
		  !strcmp(REDIS(cfg)->sentinel_username, "su") &&
		  !strcmp(REDIS(cfg)->sentinel_password, "sp"));
	test_cond(REDIS(cfg)->wait_replicas == 64 && REDIS(cfg)->wait_replicas_ms == 600000);
	test_cond(REDIS(cfg)->tls.enabled && !REDIS(cfg)->tls.verify &&
		  !strcmp(REDIS(cfg)->tls.ca_file, "/a") && !strcmp(REDIS(cfg)->tls.ca_dir, "/d") &&
		  !strcmp(REDIS(cfg)->tls.cert_file, "/c") && !strcmp(REDIS(cfg)->tls.key_file, "/k") &&
		  !strcmp(REDIS(cfg)->tls.server_name, "r.internal"));
	test_cond(REDIS(cfg)->port == 6379 && REDIS(cfg)->command_timeout_ms == 500);
	conf_release(&cfg);
	test_cond(load_text(&cfg, "redis = { tls = { }; };", err, sizeof(err)) == 0);
	test_cond(REDIS(cfg)->tls.enabled && REDIS(cfg)->tls.verify && !REDIS(cfg)->tls.ca_file &&
		  !REDIS(cfg)->sentinels && REDIS(cfg)->wait_replicas == 0 &&
		  REDIS(cfg)->wait_replicas_ms == 100);
	conf_release(&cfg);
	test_cond(load_text(&cfg, "redis = { };", err, sizeof(err)) == 0 && !REDIS(cfg)->tls.enabled);
	conf_release(&cfg);
	test_cond(rejects("redis = { sentinels = ( \"h:1\" ); };", "master_name", "required"));
	test_cond(rejects("redis = { sentinels = ( \"h\" ); master_name = \"m\"; };", "sentinels",
			  "not host:port"));
	test_cond(rejects("redis = { sentinels = ( \"h:0\" ); master_name = \"m\"; };", "sentinels",
			  "port out of range"));
	test_cond(rejects("redis = { sentinels = ( \"h:1\" ); master_name = \"m\"; port = 7; };",
			  "sentinels", "replaces port"));
	test_cond(rejects("redis = { master_name = \"m\"; };", "master_name", "need sentinels"));
	test_cond(rejects("redis = { tls = { cert_file = \"/c\"; }; };", "tls", "go together"));
	test_cond(rejects("redis = { tls = { }; socket = \"/s\"; };", "tls", "not the unix socket"));
	test_cond(rejects("redis = { wait_replicas = 65; };", "wait_replicas", "out of range"));
	test_cond(rejects("redis = { password = \"p\"; password_file = \"/x\"; };",
			  "password_file", "not both"));
	test_cond(rejects("redis = { password_file = \"/nonexistent/pw\"; };", "password_file",
			  "cannot open"));
	{
		char pw[] = "/tmp/lockshim-test-pw-XXXXXX";
		int pfd = mkstemp(pw);
		char text[256];

		test_cond(pfd >= 0 && write(pfd, "s3cret\nsecond line\n", 20) == 20);
		close(pfd);
		snprintf(text, sizeof(text), "redis = { password_file = \"%s\"; };", pw);
		test_cond(load_text(&cfg, text, err, sizeof(err)) == 0 &&
			  !strcmp(REDIS(cfg)->password, "s3cret"));
		conf_release(&cfg);
		setenv("LOCKSHIM_REDIS_PASSWORD", "from-env", 1);
		test_cond(load_text(&cfg, text, err, sizeof(err)) == 0 &&
			  !strcmp(REDIS(cfg)->password, "from-env"));
		conf_release(&cfg);
		test_cond(load_text(&cfg, "redis = { password = \"p\"; };", err, sizeof(err)) == 0 &&
			  !strcmp(REDIS(cfg)->password, "from-env"));
		conf_release(&cfg);
		unsetenv("LOCKSHIM_REDIS_PASSWORD");
		unlink(pw);
	}

	test("where and how a function is caught: method, object, offset, build_id, debug_dirs");
	test_cond(load_text(&cfg,
		"debug_dirs = ( \"/a\", \"/b/c\" );\n"
		"defaults = { method = \"entry\"; object = \"libx.so.1\"; };\n"
		"locks = ( { symbol = \"f\"; build_id = \"0A1b\"; offset = \"0x1a2b\"; },\n"
		"          { symbol = \"g\"; method = \"reloc\"; object = \"main\"; },\n"
		"          { symbol = \"h\"; method = \"auto\"; offset = 4096; } );",
		err, sizeof(err)) == 0);
	test_cond(!strcmp(cfg.debug_dirs[0], "/a") && !strcmp(cfg.debug_dirs[1], "/b/c") &&
		  !cfg.debug_dirs[2]);
	test_cond(cfg.locks[0].method == METHOD_ENTRY && !strcmp(cfg.locks[0].object, "libx.so.1"));
	test_cond(cfg.locks[0].offset == 0x1a2b && !strcmp(cfg.locks[0].build_id, "0a1b"));
	test_cond(cfg.locks[1].method == METHOD_RELOC && !strcmp(cfg.locks[1].object, "main"));
	test_cond(cfg.locks[1].offset == -1 && !cfg.locks[1].build_id);
	test_cond(cfg.locks[2].method == METHOD_AUTO && cfg.locks[2].offset == 4096);
	conf_release(&cfg);
	test_cond(load_text(&cfg, "locks = ( { symbol = \"f\"; } );", err, sizeof(err)) == 0);
	test_cond(cfg.locks[0].method == METHOD_AUTO && !cfg.locks[0].object &&
		  cfg.locks[0].offset == -1 && !strcmp(cfg.debug_dirs[0], "/usr/lib/debug"));
	conf_release(&cfg);
	test_cond(rejects("locks = ( { symbol = \"f\"; offset = 16; } );", "locks[0]",
			  "offset needs object"));
	test_cond(rejects("locks = ( { symbol = \"f\"; object = \"main\"; offset = 16; "
			  "method = \"reloc\"; } );", "locks[0]", "offset needs method"));
	test_cond(rejects("locks = ( { symbol = \"f\"; object = \"main\"; offset = \"0xz\"; } );",
			  "offset", "not an address"));
	test_cond(rejects("locks = ( { symbol = \"f\"; object = \"main\"; offset = -1; } );",
			  "offset", "out of range"));
	test_cond(rejects("locks = ( { symbol = \"f\"; build_id = \"abc\"; } );", "build_id",
			  "even number"));
	test_cond(rejects("locks = ( { symbol = \"f\"; build_id = \"xy\"; } );", "build_id",
			  "not hex"));
	test_cond(rejects("locks = ( { symbol = \"f\"; method = \"plt\"; } );", "method",
			  "expected one of: auto, entry, reloc"));
	test_cond(rejects("debug_dirs = \"/x\";", "debug_dirs", "expected a list"));
	test_cond(rejects("debug_dirs = ( \"\" );", "debug_dirs", "must not be empty"));

	test("programs: top level, defaults, per lock; conf_keep_locks");
	test_cond(load_text(&cfg,
		"programs = ( \"ledger\", \"/opt/*/bin/*\" );\n"
		"defaults = { programs = [ \"d*\" ]; };\n"
		"locks = ( { symbol = \"f\"; programs = ( \"f?\", \"[fg]x\" ); },\n"
		"          { symbols = [ \"g\", \"h\" ]; },\n"
		"          { symbol = \"i\"; key = \"k\"; } );",
		err, sizeof(err)) == 0);
	test_cond(!strcmp(cfg.programs[0], "ledger") && !strcmp(cfg.programs[1], "/opt/*/bin/*") &&
		  !cfg.programs[2]);
	test_cond(!strcmp(cfg.locks[0].programs[0], "f?") &&
		  !strcmp(cfg.locks[0].programs[1], "[fg]x") && !cfg.locks[0].programs[2]);
	test_cond(!strcmp(cfg.locks[1].programs[0], "d*") && !cfg.locks[1].programs[1] &&
		  !strcmp(cfg.locks[2].programs[0], "d*") &&
		  cfg.locks[1].programs != cfg.locks[2].programs);
	/* keep h (the second spec of locks[1]) and i: the others released */
	test_cond(conf_keep_locks(&cfg, keep_h_and_i, NULL) == 2 && cfg.nlocks == 2);
	test_cond(!strcmp(cfg.locks[0].symbol, "h") && cfg.locks[0].index == 1 &&
		  cfg.locks[0].member == 1 && !strcmp(cfg.locks[1].symbol, "i") &&
		  cfg.locks[1].index == 2 && !strcmp(cfg.locks[1].key_src, "k"));
	test_cond(!cfg.locks[2].symbol && !cfg.locks[2].programs);
	test_cond(conf_keep_locks(&cfg, keep_h_and_i, NULL) == 2);
	conf_release(&cfg);
	test_cond(load_text(&cfg, "locks = ( { symbol = \"f\"; } );", err, sizeof(err)) == 0);
	test_cond(!cfg.programs && !cfg.locks[0].programs);
	conf_release(&cfg);
	test_cond(rejects("programs = ();", "programs", "is empty"));
	test_cond(rejects("programs = [];", "programs", "is empty"));
	test_cond(rejects("programs = \"x\";", "programs", "expected a list"));
	test_cond(rejects("programs = ( \"\" );", "programs", "must not be empty"));
	test_cond(rejects("programs = ( \"a\", \"bin/x\" );", ":1: programs",
			  "starts with neither"));
	test_cond(rejects("programs = ( \"x\\\\\" );", "programs", "lone backslash"));
	test_cond(load_text(&cfg, "programs = ( \"x\\\\\\\\\", \"*/x\", \"?x/y\", \"[/]x\" );",
			    err, sizeof(err)) == 0);
	conf_release(&cfg);
	test_cond(rejects("defaults = { programs = (); };", "defaults.programs", "is empty"));
	test_cond(rejects("locks = ( { symbol = \"f\";\n programs = (); } );",
			  ":2: locks[0].programs", "is empty"));
	test_cond(rejects("locks = ( { symbol = \"f\"; programs = ( 1 ); } );", "locks[0].programs",
			  "expected a string"));

	test("every redis setting round-trips into its own member only");
	/* db, connect_timeout_ms and command_timeout_ms are adjacent ints. */
	test_cond(load_text(&cfg,
		"redis = { command_timeout_ms = 600000; connect_timeout_ms = 1; db = 2147483647;\n"
		"          username = \"u\"; password = \"p\"; socket = \"/s\"; port = 65535;\n"
		"          host = \"h\"; };", err, sizeof(err)) == 0);
	test_cond(strcmp(REDIS(cfg)->host, "h") == 0 && REDIS(cfg)->port == 65535);
	test_cond(strcmp(REDIS(cfg)->socket, "/s") == 0 && strcmp(REDIS(cfg)->password, "p") == 0);
	test_cond(strcmp(REDIS(cfg)->username, "u") == 0 && REDIS(cfg)->db == 2147483647);
	test_cond(REDIS(cfg)->connect_timeout_ms == 1 && REDIS(cfg)->command_timeout_ms == 600000);
	conf_release(&cfg);
	test_cond(load_text(&cfg, "redis = { connect_timeout_ms = 7; };", err, sizeof(err)) == 0);
	test_cond(REDIS(cfg)->connect_timeout_ms == 7 && REDIS(cfg)->command_timeout_ms == 500);
	test_cond(REDIS(cfg)->db == 0 && REDIS(cfg)->port == 6379);
	conf_release(&cfg);
	test_cond(rejects("redis = { host = \"\"; };", "redis.host", "must not be empty"));
	test_cond(rejects("redis = { username = \"u\"; };", "redis.username",
			  "needs redis.password as well"));
	test_cond(rejects("redis = 1;", "redis", "expected a group"));
	test_cond(rejects("redis = { db = -1; };", "redis.db", "out of range (0..2147483647)"));
	test_cond(rejects("namespace = \"\";", "namespace", "must be 1..128 bytes"));
	test_cond(rejects("strict = 1;", "strict", "expected true or false"));
	test_cond(load_text(&cfg, "log_level = \"INFO\"; log_file = \"/tmp/x\"; strict = true;",
			    err, sizeof(err)) == 0);
	test_cond(cfg.log_level == 2 && strcmp(cfg.log_file, "/tmp/x") == 0 && cfg.strict == 1);
	conf_release(&cfg);
	test_cond(load_text(&cfg, "log_format = \"json\"; log_syslog = true;", err,
			    sizeof(err)) == 0);
	test_cond(cfg.log_format == 1 && cfg.log_syslog == 1);
	conf_release(&cfg);
	test_cond(load_text(&cfg, "", err, sizeof(err)) == 0 && cfg.log_format == 0 &&
		  cfg.log_syslog == 0);
	conf_release(&cfg);
	test_cond(rejects("log_format = \"xml\";", "log_format", "\"xml\""));

	test("waiter_ttl_ms = 2 * retry_max_ms + redis.command_timeout_ms, for every lock");
	test_cond(load_text(&cfg, "locks = ( { symbol = \"a\"; } );", err, sizeof(err)) == 0);
	test_cond(cfg.locks[0].waiter_ttl_ms == 2 * 100 + 500);
	conf_release(&cfg);
	/* locks before redis in the file: the lock still sees the redis group;
	 * one lock inherits retry_max_ms from defaults, one sets its own. */
	test_cond(load_text(&cfg,
		"locks = ( { symbol = \"a\"; }, { symbol = \"b\"; retry_max_ms = 60000; } );\n"
		"defaults = { retry_max_ms = 7; };\n"
		"redis = { command_timeout_ms = 20; };", err, sizeof(err)) == 0);
	test_cond(cfg.locks[0].waiter_ttl_ms == 2 * 7 + 20);
	test_cond(cfg.locks[1].waiter_ttl_ms == 2 * 60000 + 20);
	test_cond(cfg.locks[1].waiter_ttl_ms ==
		  conf_waiter_ttl_ms(&cfg.locks[1], REDIS(cfg)->command_timeout_ms));
	conf_release(&cfg);

	test("a literal lock (lockshim lock): cfg->defaults' settings, KEY taken as written");
	{
		const uint64_t none[ARCH_INT_ARGS] = { 0 };
		struct lock_spec *l;
		char key[KEY_BUF_SIZE];
		size_t n;

		test_cond(load_text(&cfg, "namespace = \"ns\"; defaults = { lease_ms = 900; "
				    "retry_max_ms = 7; key = \"{arg0}\"; };\n"
				    "redis = { command_timeout_ms = 20; };", err, sizeof(err)) == 0);
		test_cond(cfg.nlocks == 0 && cfg.defaults.lease_ms == 900 &&
			  cfg.defaults.waiter_ttl_ms == 2 * 7 + 20);
		l = conf_add_literal_lock(&cfg, "a{arg0}:}{", err, sizeof(err));
		test_cond(l && cfg.nlocks == 1 && l == &cfg.locks[0] && l->lease_ms == 900 &&
			  l->waiter_ttl_ms == 2 * 7 + 20 && !strcmp(l->symbol, "a{arg0}:}{"));
		n = l ? key_expand(&l->key, none, 1, key) : 0;
		test_cond(n == strlen("ns:a{arg0}:}{") && !memcmp(key, "ns:a{arg0}:}{", n));
		test_cond(!conf_add_literal_lock(&cfg, "x:q", err, sizeof(err)) &&
			  strstr(err, ":q") && cfg.nlocks == 1);
		test_cond(!conf_add_literal_lock(&cfg, "", err, sizeof(err)) && cfg.nlocks == 1);
		conf_release(&cfg);
		test_cond(load_text(&cfg, "redis = { cluster = ( \"h:7000\" ); };\n"
				    "locks = ( { symbol = \"f\"; key = \"k\"; } );", err,
				    sizeof(err)) == 0);
		l = conf_add_literal_lock(&cfg, "k", err, sizeof(err));
		n = l ? key_expand(&l->key, none, 1, key) : 0;
		test_cond(l && cfg.nlocks == 2 && l->index == 1 &&
			  n == strlen("lockshim:{k}") && !memcmp(key, "lockshim:{k}", n));
		/* the guarded function's key and lockshim lock's are one key */
		test_cond(key_expand(&cfg.locks[0].key, none, 1, err) == n && !memcmp(err, key, n));
		conf_release(&cfg);
	}

	test("scaling out: Redis Cluster seeds, Redlock masters");
	test_cond(load_text(&cfg, "redis = { cluster = ( \"10.0.0.5:7000\", \"h:7001\" ); };",
			    err, sizeof(err)) == 0);
	test_cond(!strcmp(REDIS(cfg)->cluster[0], "10.0.0.5:7000") &&
		  !strcmp(REDIS(cfg)->cluster[1], "h:7001") && !REDIS(cfg)->cluster[2] &&
		  !REDIS(cfg)->masters);
	conf_release(&cfg);
	test_cond(load_text(&cfg,
		"redis = { password = \"top\"; db = 3; command_timeout_ms = 77;\n"
		"          tls = { ca_file = \"/a\"; server_name = \"n\"; };\n"
		"          masters = ( { host = \"10.0.0.5\"; },\n"
		"                      { host = \"10.0.0.6\"; port = 7000; password = \"own\";\n"
		"                        username = \"u\"; db = 0; tls = { verify = false; }; },\n"
		"                      { host = \"10.0.0.7\"; port = 7001; } ); };",
		err, sizeof(err)) == 0);
	test_cond(REDIS(cfg)->nmasters == 3 && !REDIS(cfg)->cluster);
	{
		const struct redis_spec *m = REDIS(cfg)->masters;

		test_cond(!strcmp(m[0].host, "10.0.0.5") && m[0].port == 6379 &&
			  !strcmp(m[0].password, "top") && !m[0].username && m[0].db == 3 &&
			  m[0].tls.enabled && m[0].tls.verify && !strcmp(m[0].tls.ca_file, "/a") &&
			  !strcmp(m[0].tls.server_name, "n") && m[0].command_timeout_ms == 77);
		test_cond(m[1].port == 7000 && !strcmp(m[1].password, "own") &&
			  !strcmp(m[1].username, "u") && m[1].db == 0 && m[1].tls.enabled &&
			  !m[1].tls.verify && !m[1].tls.ca_file);
		test_cond(!strcmp(m[2].host, "10.0.0.7") && m[2].port == 7001);
	}
	conf_release(&cfg);
	test_cond(rejects("redis = { cluster = ( ); };", "cluster", "is empty"));
	test_cond(rejects("redis = { cluster = ( \"h\" ); };", "cluster", "not host:port"));
	test_cond(rejects("redis = { cluster = ( \"h:1\" ); host = \"x\"; };", "cluster",
			  "replaces host"));
	test_cond(rejects("redis = { cluster = ( \"h:1\" ); db = 1; };", "db", "database 0"));
	test_cond(rejects("namespace = \"a{b}\"; redis = { cluster = ( \"h:1\" ); };\n"
			  "locks = ( { symbol = \"f\"; } );", "namespace", "hash tag"));
	test_cond(rejects("redis = { masters = ( { host = \"a\"; }, { host = \"b\"; } ); };",
			  "masters", "3 or more"));
	test_cond(rejects("redis = { masters = ( { host = \"a\"; }, { host = \"b\"; },\n"
			  "{ port = 1; } ); };", "masters[2]", "host (and port) or socket"));
	test_cond(rejects("redis = { masters = ( { host = \"a\"; }, { host = \"b\"; },\n"
			  "{ host = \"c\"; wait_replicas = 1; } ); };", "masters[2].wait_replicas",
			  "unknown setting"));
	test_cond(rejects("redis = { port = 7; masters = ( { host = \"a\"; }, { host = \"b\"; },\n"
			  "{ host = \"c\"; } ); };", "masters", "replaces port"));
	test_cond(rejects("redis = { masters = ( { host = \"a\"; }, { host = \"b\"; },\n"
			  "{ host = \"c\"; } ); };\nlocks = ( { symbol = \"f\"; fair = true; } );",
			  "locks[0]", "not available with redis.masters"));
	test_cond(rejects("redis = { masters = { host = \"a\"; }; };", "masters", "list of groups"));
	/* backend: the named ones without a registered group are not built */
	test_cond(rejects("backend = \"zookeeper\";", "backend", "not available in this build"));
	test_cond(rejects("backend = \"consul\";", "backend", "unknown value"));
	test_cond(rejects("backend = \"local\";", "backend", "\"local\" is not available"));

	test("settings_describe: the tables, their defaults are the built-in values");
	{
		struct settings_desc d;
		char text[1024], plain[4096], with[4096];
		int n = 0, nlock = 0, literal = 0, ok;

		config_with(text, sizeof(text), "lock", NULL, NULL);
		test_cond(load_text(&cfg, text, err, sizeof(err)) == 0);
		dump(&cfg, plain, sizeof(plain));
		conf_release(&cfg);
		for (int i = 0; settings_describe(groups, i, &d); i++, n++) {
			ok = !strcmp(d.group, "top") || !strcmp(d.group, "redis") ||
			     !strcmp(d.group, "tls") || !strcmp(d.group, "master") ||
			     !strcmp(d.group, "lock");
			ok = ok && *d.name && *d.type && *d.dflt && !strpbrk(d.dflt, " \t\n") &&
			     !strpbrk(d.type, " \t\n");
			if (!ok)
				fprintf(stderr, "  bad description: %s %s %s %s\n", d.group,
					d.name, d.type, d.dflt);
			test_cond(ok);
			nlock += !strcmp(d.group, "lock");
			/* A literal default given explicitly changes nothing (log_level
			 * aside: unset is -1, the log's own threshold, "warn"). */
			if (!strcmp(d.dflt, "none") || !strcmp(d.dflt, "required") ||
			    d.dflt[0] == '=' || !strcmp(d.type, "group") ||
			    !strcmp(d.type, "list") || !strcmp(d.name, "log_level") ||
			    !strcmp(d.group, "master"))
				continue;
			literal++;
			config_with(text, sizeof(text), d.group, d.name, d.dflt);
			ok = load_text(&cfg, text, err, sizeof(err)) == 0;
			dump(&cfg, with, sizeof(with));
			conf_release(&cfg);
			if (!ok || strcmp(plain, with) != 0)
				fprintf(stderr, "  %s %s = %s: %s\n  %s\n  %s\n", d.group, d.name,
					d.dflt, ok ? "differs" : err, plain, with);
			test_cond(ok && strcmp(plain, with) == 0);
		}
		/* A new setting changes these counts: give it a round trip in
		 * the tests above, then count it here. */
		test_cond(n == 11 + 19 + 6 + 8 + 32 && nlock == 32 && literal >= 35);
		test_cond(!settings_describe(groups, n, &d) && !settings_describe(groups, -1, &d));
		test_cond(settings_describe(groups, 0, &d) && !strcmp(d.group, "top") &&
			  !strcmp(d.name, "redis"));
	}
	/* The non-literal defaults say what they follow. */
	test_cond(load_text(&cfg, "strict = true; defaults = { on_timeout = \"abort\"; };\n"
			    "locks = ( { symbol = \"f\"; } );", err, sizeof(err)) == 0);
	test_cond(cfg.locks[0].strict == 1 && cfg.locks[0].on_error == POLICY_ABORT);
	conf_release(&cfg);

	test("no locks is valid");
	test_cond(load_text(&cfg, "namespace = \"x\";", err, sizeof(err)) == 0 && cfg.nlocks == 0);
	conf_release(&cfg);

	test("errors name the file, the line, the setting and the value");
	test_cond(rejects("locks = ( { symbol = \"f\"; on_timeout = \"sometimes\"; } );",
			  ":1: locks[0].on_timeout", "\"sometimes\""));
	test_cond(rejects("\n\nlocks = ( { symbol = \"f\";\n lease_msx = 5; } );",
			  ":4: locks[0].lease_msx", "unknown setting"));
	test_cond(rejects("locks = ( { key = \"x\"; } );", "locks[0]", "missing required setting \"symbol\""));
	test_cond(rejects("locks = ( { symbol = \"f\"; key = \"{arg9}\"; } );", "locks[0].key", "out of range"));
	test_cond(rejects("locks = ( { symbol = \"f\"; lease_ms = 5; } );", "lease_ms", "out of range"));
	test_cond(rejects("locks = ( { symbol = \"f\"; lease_ms = \"5\"; } );", "lease_ms", "expected an integer"));
	test_cond(rejects("locks = ( { symbol = \"f\"; errno = \"EWHAT\"; } );", "errno", "EWHAT"));
	test_cond(rejects("locks = ( { symbol = \"f\"; kill_signal = \"SIGNOPE\"; } );", "kill_signal", "SIGNOPE"));
	test_cond(rejects("locks = ( { symbol = \"setjmp\"; } );", "symbol", "cannot be guarded"));
	test_cond(rejects("locks = ( { symbol = \"f\"; }, { symbol = \"f\"; } );", "locks[1]", "already guarded"));
	test_cond(rejects("locks = ( { symbol = \"f\" } ", "syntax error", NULL));
	test_cond(rejects("colour = \"red\";", "colour", "unknown setting"));
	test_cond(rejects("redis = { hots = \"x\"; };", "redis.hots", "unknown setting"));
	test_cond(rejects("redis = { port = 70000; };", "redis.port", "out of range"));
	test_cond(rejects("log_level = \"loud\";", "log_level", "\"loud\""));
	test_cond(rejects("defaults = { symbol = \"f\"; };", "defaults.symbol", "per lock"));
	test_cond(rejects("defaults = { key = \"{bad}\"; }; locks = ( { symbol = \"f\"; } );",
			  "locks[0].key", "unknown placeholder"));
	test_cond(rejects("locks = ( { symbol = \"f\"; reentrant = 1; } );", "reentrant", "true or false"));

	test("symbols: one lock of several symbols, one spec each, settings shared");
	test_cond(load_text(&cfg, "locks = ( { symbols = ( \"rename\", \"renameat\", \"renameat2\" );"
			    " key = \"mv:{symbol}\"; lease_ms = 900; on_timeout = \"exit\"; },\n"
			    "{ symbol = \"g\"; } );", err, sizeof(err)) == 0);
	test_cond(cfg.nlocks == 4);
	{
		static const char *const want[] = { "rename", "renameat", "renameat2", "g" };
		uint64_t args[ARCH_INT_ARGS] = { 0 };
		char key[KEY_BUF_SIZE], expect[64];
		size_t k;

		for (int i = 0; i < 4; i++) {
			const struct lock_spec *l = &cfg.locks[i];

			test_cond(!strcmp(l->symbol, want[i]) && conf_find(&cfg, want[i]) == l);
			test_cond(l->index == (i == 3) && l->member == (i == 3 ? 0 : i));
			test_cond(i == 3 ? !l->symbols : !strcmp(l->symbols[i], want[i]) &&
				  !strcmp(l->symbols[0], "rename") && !l->symbols[3]);
			test_cond(i == 3 || (l->lease_ms == 900 && l->on_error == POLICY_EXIT));
			k = key_expand(&l->key, args, 1, key);
			snprintf(expect, sizeof(expect), i == 3 ? "lockshim:%s" : "lockshim:mv:%s",
				 want[i]);
			test_cond(k == strlen(expect) && !memcmp(key, expect, k));
		}
	}
	conf_release(&cfg);
	test_cond(load_text(&cfg, "locks = ( { symbols = [ \"a\", \"b\" ]; key = \"k\"; } );",
			    err, sizeof(err)) == 0 && cfg.nlocks == 2);
	{
		uint64_t args[ARCH_INT_ARGS] = { 0 };
		char k0[KEY_BUF_SIZE], k1[KEY_BUF_SIZE];
		size_t n0 = key_expand(&cfg.locks[0].key, args, 1, k0);
		size_t n1 = key_expand(&cfg.locks[1].key, args, 1, k1);

		test_cond(n0 == n1 && !memcmp(k0, k1, n0) && !memcmp(k0, "lockshim:k", n0));
	}
	conf_release(&cfg);

	test("keys: several templates, each compiled with the lock's namespace and {symbol}");
	test_cond(load_text(&cfg, "namespace = \"n\";\nlocks = ( { symbols = ( \"a\", \"b\" ); "
			    "keys = ( \"acct:{arg1}\", \"{symbol}:{arg0}\" ); } );",
			    err, sizeof(err)) == 0 && cfg.nlocks == 2);
	{
		uint64_t args[ARCH_INT_ARGS] = { 7, 9 };
		char k[KEY_BUF_SIZE];
		const struct lock_spec *b = &cfg.locks[1];
		size_t n0 = key_expand(conf_key(b, 0), args, 1, k);

		test_cond(cfg.locks[0].nkeys == 2 && b->nkeys == 2 &&
			  !strcmp(b->keys_src[1], "{symbol}:{arg0}"));
		test_cond(n0 == 8 && !memcmp(k, "n:acct:9", n0));
		n0 = key_expand(conf_key(b, 1), args, 1, k);
		test_cond(n0 == 5 && !memcmp(k, "n:b:7", n0));
	}
	conf_release(&cfg);
	test_cond(load_text(&cfg, "locks = ( { symbol = \"f\"; keys = [ \"x\" ]; } );", err,
			    sizeof(err)) == 0 && cfg.locks[0].nkeys == 1 && !cfg.locks[0].more_keys);
	conf_release(&cfg);
	test_cond(load_text(&cfg, "locks = ( { symbol = \"f\"; } );", err, sizeof(err)) == 0 &&
		  cfg.locks[0].nkeys == 1 && !cfg.locks[0].keys_src);
	conf_release(&cfg);
	test_cond(load_text(&cfg, "defaults = { key = \"d\"; };\nlocks = ( { symbol = \"f\"; "
			    "keys = ( \"x\", \"y\" ); } );", err, sizeof(err)) == 0 &&
		  cfg.locks[0].nkeys == 2);
	conf_release(&cfg);
	test("keys: refused beside key, empty, over 16, in defaults, a bad template");
	test_cond(rejects("locks = ( { symbol = \"f\"; key = \"k\"; keys = ( \"a\" ); } );",
			  "locks[0].keys", "key and keys together"));
	test_cond(rejects("locks = ( { symbol = \"f\"; keys = (); } );", "locks[0].keys",
			  "is empty"));
	test_cond(rejects("locks = ( { symbol = \"f\"; keys = ( \"1\", \"2\", \"3\", \"4\", "
			  "\"5\", \"6\", \"7\", \"8\", \"9\", \"10\", \"11\", \"12\", \"13\", "
			  "\"14\", \"15\", \"16\", \"17\" ); } );", "locks[0].keys", "at most 16"));
	test_cond(rejects("defaults = { keys = ( \"a\" ); };", "defaults.keys", "per lock"));
	test_cond(rejects("locks = ( { symbol = \"f\";\n keys = ( \"a\", \"b:{arg9}\" ); } );",
			  ":2: locks[0].keys", "out of range"));
	test_cond(rejects("locks = ( { symbol = \"f\"; keys = ( \"a\", \"b:q\" ); } );",
			  "locks[0].keys", "ends in"));
	test_cond(rejects("locks = ( { symbol = \"f\"; keys = \"a\"; } );", "locks[0].keys",
			  "expected a list"));

	test("symbols: a list of one is symbol (round trip)");
	{
		char one[2048], list[2048];

		test_cond(load_text(&cfg, "locks = ( { symbol = \"fn\"; key = \"x:{symbol}\"; } );",
				    err, sizeof(err)) == 0);
		dump(&cfg, one, sizeof(one));
		conf_release(&cfg);
		test_cond(load_text(&cfg, "locks = ( { symbols = ( \"fn\" ); key = \"x:{symbol}\"; } );",
				    err, sizeof(err)) == 0);
		dump(&cfg, list, sizeof(list));
		test_cond(!strcmp(one, list) && !strcmp(cfg.locks[0].symbols[0], "fn"));
		conf_release(&cfg);
	}

	test("symbols: refusals");
	test_cond(rejects("locks = ( { symbol = \"f\"; symbols = ( \"g\" ); } );", "locks[0]",
			  "symbol and symbols together"));
	test_cond(rejects("locks = ( { key = \"x\"; } );", "locks[0]",
			  "missing required setting \"symbol\" (or \"symbols\""));
	test_cond(rejects("locks = ( { symbols = ( ); } );", "locks[0].symbols", "is empty"));
	test_cond(rejects("locks = ( { symbols = \"f\"; } );", "locks[0].symbols", "expected a list"));
	test_cond(rejects("locks = ( { symbols = ( \"f\", \"\" ); } );", "locks[0].symbols",
			  "must not be empty"));
	test_cond(rejects("locks = ( { symbols = ( \"f\", \"g\", \"f\" ); } );", "locks[0].symbols",
			  "\"f\" is named twice"));
	test_cond(rejects("locks = ( { symbols = ( \"f\", \"setjmp\" ); } );", "locks[0].symbols",
			  "cannot be guarded"));
	test_cond(rejects("locks = ( { symbols = ( \"f\", \"a-b\" ); } );", "locks[0].symbols",
			  "not a symbol name"));
	test_cond(rejects("locks = ( { symbol = \"a\"; },\n{ symbols = ( \"b\", \"a\" ); } );",
			  ":2: locks[1].symbols", "\"a\" is already guarded by locks[0]"));
	test_cond(rejects("locks = ( { symbols = ( \"a\", \"b\" ); },\n{ symbol = \"b\"; } );",
			  ":2: locks[1].symbol", "\"b\" is already guarded by locks[0]"));
	test_cond(rejects("locks = ( { symbols = ( \"a\", \"b\" ); }, { symbol = \"c\"; },\n"
			  "{ symbols = ( \"d\", \"b\" ); } );", "locks[2].symbols",
			  "already guarded by locks[0]"));
	test_cond(rejects("defaults = { symbols = ( \"f\" ); };", "defaults.symbols", "per lock"));
	test_cond(rejects("locks = ( { symbols = ( \"f\", \"g\" ); object = \"main\"; offset = 16; } );",
			  "locks[0]", "needs one symbol"));
	test_cond(rejects("locks = ( { symbols = ( \"f\", \"g\" ); key = \"{arg9}\"; } );",
			  "locks[0].key", "out of range"));

	test("conf_fields_default: the tables hold the built-in values");
	{
		struct lock_spec l = { 0 };
		struct redis_spec r = { 0 };
		struct conf c = { 0 };

		test_cond(conf_fields_default(conf_lock_fields, &l) == 0);
		test_cond(!strcmp(l.key_src, "{symbol}") && !l.symbol && !l.object && !l.build_id);
		test_cond(l.lease_ms == 30000 && l.wait_ms == 10000 && l.handoff_us == 500 &&
			  l.linger_ms == 1 && l.retry_max_ms == 100 && l.stack_args_bytes == 256);
		test_cond(l.ret == -1 && l.ret_double == -1.0 && l.err == EBUSY &&
			  l.exit_code == 75 && l.kill_signal == SIGTERM && l.kill_grace_ms == 5000);
		test_cond(l.on_timeout == POLICY_SKIP && l.on_error == -1 && l.on_lost == HOLD_LOG &&
			  l.reentrant == 1 && l.break_dead == 1 && l.fair == 0 && l.offset == -1 &&
			  l.method == METHOD_AUTO);
		conf_fields_release(conf_lock_fields, &l);
		test_cond(!l.key_src);
		test_cond(conf_fields_default(backend_redis_settings.fields, &r) == 0);
		test_cond(!strcmp(r.host, "127.0.0.1") && r.port == 6379 && r.db == 0 &&
			  r.connect_timeout_ms == 500 && r.command_timeout_ms == 500 &&
			  r.wait_replicas_ms == 100 && r.tls.verify == 1 && !r.tls.enabled &&
			  !r.sentinels && !r.cluster && !r.masters && !r.nmasters);
		conf_fields_release(backend_redis_settings.fields, &r);
		test_cond(!r.host);
		test_cond(conf_fields_default(conf_top_fields, &c) == 0);
		test_cond(!strcmp(c.ns, "lockshim") && c.log_level == -1 && !c.log_file &&
			  c.debug_dirs && !strcmp(c.debug_dirs[0], "/usr/lib/debug") &&
			  !c.debug_dirs[1]);
		conf_fields_release(conf_top_fields, &c);
		test_cond(!c.ns && !c.debug_dirs);
	}

	test("conf_fields_copy, conf_fields_release: every owned member, by the tables");
	test_cond(load_text(&cfg, "redis = { masters = ( { host = \"a\"; }, { host = \"b\"; port = 7;"
			    " tls = { ca_file = \"/m\"; }; }, { host = \"c\"; } );\n"
			    " tls = { ca_file = \"/ca\"; verify = false; }; password = \"pw\"; };\n"
			    "locks = ( { symbol = \"f\"; object = \"/o\"; build_id = \"AB12\";"
			    " key = \"k:{arg0}\"; return = 2.5; offset = 16; } );", err,
			    sizeof(err)) == 0);
	{
		const struct lock_spec *l = &cfg.locks[0];
		const struct redis_spec *r = REDIS(cfg);
		struct lock_spec c = { 0 };
		struct redis_spec rc = { 0 };

		test_cond(conf_fields_copy(conf_lock_fields, &c, l) == 0);
		test_cond(c.symbol != l->symbol && !strcmp(c.symbol, "f") &&
			  c.key_src != l->key_src && !strcmp(c.key_src, "k:{arg0}") &&
			  c.object != l->object && !strcmp(c.object, "/o") &&
			  c.build_id != l->build_id && !strcmp(c.build_id, "ab12"));
		test_cond(c.ret == 2 && c.ret_double == 2.5 && c.offset == 16 &&
			  c.lease_ms == l->lease_ms && c.handoff_us == l->handoff_us);
		/* a second copy frees what the first made (ASan's leak check) */
		test_cond(conf_fields_copy(conf_lock_fields, &c, l) == 0 && !strcmp(c.object, "/o"));
		conf_fields_release(conf_lock_fields, &c);
		test_cond(!c.symbol && !c.key_src && !c.object && !c.build_id);

		test_cond(conf_fields_copy(backend_redis_settings.fields, &rc, r) == 0);
		test_cond(rc.nmasters == 3 && rc.masters && rc.masters != r->masters);
		test_cond(rc.masters[1].host != r->masters[1].host &&
			  !strcmp(rc.masters[1].host, "b") && rc.masters[1].port == 7 &&
			  rc.masters[1].tls.enabled && !strcmp(rc.masters[1].tls.ca_file, "/m"));
		test_cond(!strcmp(rc.masters[0].tls.ca_file, "/ca") && !rc.masters[0].tls.verify &&
			  !strcmp(rc.masters[0].password, "pw") && !strcmp(rc.masters[2].host, "c"));
		test_cond(rc.tls.enabled && rc.tls.ca_file != r->tls.ca_file &&
			  !strcmp(rc.tls.ca_file, "/ca") && !strcmp(rc.password, "pw"));
		test_cond(conf_fields_copy(backend_redis_settings.fields, &rc, r) == 0 &&
			  rc.nmasters == 3);
		conf_fields_release(backend_redis_settings.fields, &rc);
		test_cond(!rc.masters && !rc.nmasters && !rc.tls.ca_file && !rc.password && !rc.host);
	}
	conf_release(&cfg);

	test("settings_diff: what differs from the defaults, secrets hidden");
	unsetenv("LOCKSHIM_REDIS_PASSWORD");
	{
		char diff[1024];

		test_cond(load_text(&cfg, "locks = ( { symbol = \"f\"; } );", err, sizeof(err)) == 0);
		settings_diff(&cfg, NULL, diff, sizeof(diff));
		test_cond(!strcmp(diff, ""));
		settings_diff(&cfg, &cfg.locks[0], diff, sizeof(diff));
		test_cond(!strcmp(diff, ""));
		conf_release(&cfg);

		test_cond(load_text(&cfg, "namespace = \"app\"; strict = true;\n"
				    "redis = { password = \"s3cret\"; port = 7000; host = \"127.0.0.1\"; };\n"
				    "defaults = { wait_ms = 0; };\n"
				    "locks = ( { symbol = \"f\"; lease_ms = 5000; on_error = \"skip\"; },\n"
				    " { symbol = \"g\"; on_timeout = \"exit\"; on_error = \"skip\";"
				    " strict = false; wait_ms = 10000; key = \"x\"; } );",
				    err, sizeof(err)) == 0);
		settings_diff(&cfg, NULL, diff, sizeof(diff));
		test_cond(!strcmp(diff, "redis.port 7000, redis.password (hidden), "
				  "namespace \"app\", strict true"));
		test_cond(!strstr(diff, "s3cret"));
		settings_diff(&cfg, &cfg.locks[0], diff, sizeof(diff));
		test_cond(!strcmp(diff, "lease_ms 5000, wait_ms 0"));
		settings_diff(&cfg, &cfg.locks[1], diff, sizeof(diff));
		test_cond(!strcmp(diff, "on_timeout \"exit\", on_error \"skip\", strict false"));
		conf_release(&cfg);

		test_cond(load_text(&cfg, "redis = { masters = ( { host = \"a\"; },"
				    " { host = \"b\"; port = 7000; tls = { }; }, { socket = \"/s\"; db = 2; } );"
				    " password = \"p\"; db = 1; };", err, sizeof(err)) == 0);
		settings_diff(&cfg, NULL, diff, sizeof(diff));
		test_cond(!strcmp(diff, "redis.password (hidden), redis.db 1, "
				  "redis.masters[0].host \"a\", redis.masters[1].host \"b\", "
				  "redis.masters[1].port 7000, redis.masters[1].tls {}, "
				  "redis.masters[2].socket \"/s\", redis.masters[2].db 2"));
		conf_release(&cfg);
	}

	test("missing file");
	unlink(path);
	test_cond(conf_load(&cfg, path, groups, err, sizeof(err)) != 0 && strstr(err, path) &&
		  strstr(err, "cannot open"));
	conf_release(&cfg);
	open_trusted();
	remote_filesystems();
	return test_report("config");
}
