//! A private PostgreSQL server for tests that must not touch the shared one: TLS settings,
//! restarts, stops. [`PrivatePostgres::builder`] runs `initdb` (from PATH) in a temporary
//! directory, adds the caller's `postgresql.conf` lines, `pg_hba.conf` lines and data files,
//! and starts the server with `pg_ctl` on a free loopback port, with a Unix socket in the same
//! directory. As root (initdb refuses root) every server command runs as the `postgres` user,
//! through `runuser`. Dropping the server stops it (`pg_ctl stop -m immediate`) and removes
//! its directory.
//!
//! Without initdb, [`PrivatePostgresBuilder::start`] returns the reason, for a skip notice.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A running private server; see the [module](self) documentation.
#[derive(Debug)]
pub struct PrivatePostgres {
    dir: tempfile::TempDir,
    port: u16,
    /// `postgres` when the tests run as root.
    run_as: Option<&'static str>,
    stopped: bool,
}

/// What [`PrivatePostgres::builder`] sets up before the server starts.
#[derive(Debug, Clone)]
pub struct PrivatePostgresBuilder {
    prefix: String,
    conf: Vec<String>,
    hba: Option<Vec<String>>,
    files: Vec<(String, Vec<u8>, u32)>,
}

/// `program`, as `user` when given, in `dir`.
fn command(run_as: Option<&str>, program: &str, dir: &Path) -> Command {
    let mut command = match run_as {
        Some(user) => {
            let mut c = Command::new("runuser");
            c.args(["-u", user, "--", program]);
            c
        }
        None => Command::new(program),
    };
    // The test's own directory may be closed to the `postgres` user.
    command.current_dir(dir);
    command
}

fn run(command: &mut Command, what: &str) -> Result<(), String> {
    let out = command.output().map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }
}

/// The uid and gid of `user`, from /etc/passwd.
fn user_ids(user: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.first() == Some(&user)).then(|| Some((fields.get(2)?.parse().ok()?, fields.get(3)?.parse().ok()?)))?
    })
}

impl PrivatePostgresBuilder {
    /// The temporary directory's name prefix (default `kuralle-pg-`).
    #[must_use]
    pub fn prefix(mut self, prefix: &str) -> Self {
        prefix.clone_into(&mut self.prefix);
        self
    }

    /// A line appended to `postgresql.conf`, after the defaults (loopback only, the socket
    /// directory, no fsync, 100 connections), so it overrides them.
    #[must_use]
    pub fn conf(mut self, line: &str) -> Self {
        self.conf.push(line.to_owned());
        self
    }

    /// A `pg_hba.conf` line. Without any, TCP from 127.0.0.1 is trusted; with some, the file
    /// is `local all all trust` (the socket, for [`PrivatePostgres::admin`]) and these lines.
    #[must_use]
    pub fn hba(mut self, line: &str) -> Self {
        self.hba.get_or_insert_with(Vec::new).push(line.to_owned());
        self
    }

    /// A file in the data directory (a certificate, a key), owned by the server's user, with
    /// permissions `mode`.
    #[must_use]
    pub fn data_file(mut self, name: &str, contents: impl Into<Vec<u8>>, mode: u32) -> Self {
        self.files.push((name.to_owned(), contents.into(), mode));
        self
    }

    /// Runs initdb and starts the server. `Err` says why it cannot run here (no initdb, or
    /// root without a `postgres` user), for a skip notice.
    ///
    /// # Panics
    /// When initdb or the server fails, or the files cannot be written.
    pub fn start(self) -> Result<PrivatePostgres, String> {
        if Command::new("initdb").arg("--version").output().is_err() {
            return Err("initdb is not on PATH (PostgreSQL's server binaries are needed)".into());
        }
        let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
        let owner = if root {
            Some(user_ids("postgres").ok_or("running as root, and there is no `postgres` user to run initdb as")?)
        } else {
            None
        };
        let run_as = root.then_some("postgres");
        let dir = tempfile::Builder::new().prefix(&self.prefix).tempdir().expect("a temporary directory");
        let chown = |path: &Path| {
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(path, Some(uid), Some(gid)).expect("chown to the server's user");
            }
        };
        chown(dir.path());
        let data = dir.path().join("data");
        run(
            command(run_as, "initdb", dir.path()).arg("-D").arg(&data).args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ]),
            "initdb",
        )
        .expect("initdb");

        for (name, contents, mode) in &self.files {
            let path = data.join(name);
            std::fs::write(&path, contents).expect("a data file is written");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(*mode)).expect("its mode is set");
            chown(&path);
        }
        let socket = dir.path().join("sock");
        std::fs::create_dir(&socket).expect("the socket directory");
        chown(&socket);

        let mut conf = std::fs::read_to_string(data.join("postgresql.conf")).expect("postgresql.conf");
        conf.push_str(&format!(
            "\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\nfsync = off\n\
             synchronous_commit = off\nfull_page_writes = off\nmax_connections = 100\n",
            socket.display()
        ));
        for line in &self.conf {
            conf.push_str(line);
            conf.push('\n');
        }
        std::fs::write(data.join("postgresql.conf"), conf).expect("postgresql.conf is written");
        let hba = match &self.hba {
            None => "local all all trust\nhost all all 127.0.0.1/32 trust\n".to_owned(),
            Some(lines) => format!("local all all trust\n{}\n", lines.join("\n")),
        };
        std::fs::write(data.join("pg_hba.conf"), hba).expect("pg_hba.conf is written");

        // A free port now may be taken before the server binds it: try a few.
        let mut last = String::new();
        for _ in 0..3 {
            let port =
                std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
            match pg_ctl(run_as, dir.path(), port, &["-w", "-t", "60", "start"]) {
                Ok(()) => return Ok(PrivatePostgres { dir, port, run_as, stopped: false }),
                Err(e) => {
                    last =
                        format!("{e}\n{}", std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default())
                }
            }
        }
        panic!("the private PostgreSQL server does not start: {last}");
    }
}

/// `pg_ctl -D <dir>/data -l <dir>/server.log -o "-p <port>" <args>`.
fn pg_ctl(run_as: Option<&str>, dir: &Path, port: u16, args: &[&str]) -> Result<(), String> {
    run(
        command(run_as, "pg_ctl", dir)
            .arg("-D")
            .arg(dir.join("data"))
            .arg("-l")
            .arg(dir.join("server.log"))
            .args(["-o", &format!("-p {port}")])
            .args(args),
        &format!("pg_ctl {}", args.join(" ")),
    )
}

impl PrivatePostgres {
    /// A server with the defaults: trusted TCP from 127.0.0.1, no TLS.
    #[must_use]
    pub fn builder() -> PrivatePostgresBuilder {
        PrivatePostgresBuilder { prefix: "kuralle-pg-".into(), conf: Vec::new(), hba: None, files: Vec::new() }
    }

    /// The TCP port on 127.0.0.1.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's directory: `data/`, `sock/`, `server.log`; a place for the test's own
    /// files too.
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The directory of the server's Unix socket.
    #[must_use]
    pub fn socket_dir(&self) -> PathBuf {
        self.dir.path().join("sock")
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres` (superuser, database `postgres`).
    #[must_use]
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The server's log so far.
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// A superuser connection over the Unix socket (where TLS and `pg_hba.conf`'s TCP lines
    /// play no part).
    ///
    /// # Panics
    /// When it does not connect.
    pub async fn admin(&self) -> tokio_postgres::Client {
        let mut config = tokio_postgres::Config::new();
        config.host_path(self.socket_dir()).port(self.port).user("postgres").dbname("postgres");
        let (client, connection) = config.connect(tokio_postgres::NoTls).await.expect("the admin connection");
        tokio::spawn(connection);
        client
    }

    /// `pg_ctl restart -m fast`: the server disconnects every client (ending their
    /// transactions), shuts down and starts again on the same port. Returns once it accepts
    /// connections, with how long that took.
    ///
    /// # Panics
    /// When the server does not come back.
    pub fn restart_fast(&self) -> Duration {
        let started = Instant::now();
        if let Err(e) = pg_ctl(self.run_as, self.dir.path(), self.port, &["-m", "fast", "-w", "-t", "60", "restart"]) {
            panic!("the private PostgreSQL server does not restart: {e}\n{}", self.log());
        }
        started.elapsed()
    }

    /// Stops the server (`pg_ctl stop -m immediate`); the directory stays until the drop.
    ///
    /// # Panics
    /// When `pg_ctl` fails.
    pub fn stop(&mut self) {
        if !self.stopped {
            self.stopped = true;
            if let Err(e) = pg_ctl(self.run_as, self.dir.path(), self.port, &["-m", "immediate", "-w", "stop"]) {
                panic!("could not stop the private PostgreSQL server: {e}");
            }
        }
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        if !self.stopped {
            self.stopped = true;
            if let Err(e) = pg_ctl(self.run_as, self.dir.path(), self.port, &["-m", "immediate", "-w", "stop"]) {
                eprintln!("could not stop the private PostgreSQL server: {e}");
            }
        }
    }
}
