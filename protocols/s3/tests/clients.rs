//! Real S3 clients against the adapter: boto3, PyTorch's S3 connector client, the AWS CLI,
//! rclone, s3cmd and MinIO's SDK, each run as a
//! script from here against an in-process server. A missing client fails the test with the
//! package to install (scripts/deps.sh installs them in CI).

mod common;

use std::path::PathBuf;

use common::{Server, start};

fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients").join(name)
}

fn require(cmd: &str, args: &[&str], install: &str) {
    let ok = std::process::Command::new(cmd).args(args).output().is_ok_and(|o| o.status.success());
    assert!(ok, "`{cmd} {}` does not work: install {install}", args.join(" "));
}

async fn run(s: &Server, program: &str, args: &[&str]) {
    run_with(s, program, args, &[]).await
}

/// [`run`], with more variables in the client's environment.
async fn run_with(s: &Server, program: &str, args: &[&str], env: &[(&str, &str)]) {
    let out = tokio::process::Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .env("ENDPOINT", s.endpoint())
        .env("ACCESS", &s.access)
        .env("SECRET", &s.secret)
        .output()
        .await
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{program} {args:?} failed:\n{text}");
    eprintln!("{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boto3_suite_passes() {
    require("python3", &["-c", "import boto3"], "boto3 (pip install boto3)");
    let s = start().await;
    run(&s, "python3", &[script("boto3_suite.py").to_str().unwrap()]).await;
    s.stop().await;
}

/// Where scripts/deps.sh installs playwright-core, which drives Chromium.
const PLAYWRIGHT_DIR: &str = "/var/cache/aquifer-node";

/// Chromium as a web page's S3 client: the bucket's CORS rules decide, in the browser, which
/// page may upload and read (clients/browser_cors.py).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_pages_get_what_bucket_cors_rules_allow() {
    require("python3", &["-c", "import boto3"], "boto3 (pip install boto3)");
    require("chromium", &["--version"], "Chromium (apt-get install chromium)");
    let probe = format!("require('module').createRequire('{PLAYWRIGHT_DIR}/')('playwright-core')");
    require("node", &["-e", &probe], &format!("playwright-core (npm install playwright-core in {PLAYWRIGHT_DIR}; scripts/deps.sh does)"));
    let s = start().await;
    run_with(&s, "python3", &[script("browser_cors.py").to_str().unwrap()], &[("PLAYWRIGHT_DIR", PLAYWRIGHT_DIR)]).await;
    s.stop().await;
}

/// The client under PyTorch's S3 connector (Mountpoint's S3 client on the AWS CRT).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3torchconnector_client_suite_passes() {
    require(
        "python3",
        &["-c", "import boto3, s3torchconnectorclient"],
        "s3torchconnectorclient and boto3 (pip install s3torchconnectorclient==1.5.0 boto3)",
    );
    let s = start().await;
    run(&s, "python3", &[script("s3torch_suite.py").to_str().unwrap()]).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awscli_suite_passes() {
    require("aws", &["--version"], "awscli (apt-get install awscli)");
    let s = start().await;
    run(&s, "bash", &[script("awscli_suite.sh").to_str().unwrap()]).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rclone_suite_passes() {
    require("rclone", &["version"], "rclone (apt-get install rclone)");
    let s = start().await;
    run(&s, "bash", &[script("rclone_suite.sh").to_str().unwrap()]).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3cmd_suite_passes() {
    require("s3cmd", &["--version"], "s3cmd (apt-get install s3cmd)");
    let s = start().await;
    run(&s, "bash", &[script("s3cmd_suite.sh").to_str().unwrap()]).await;
    s.stop().await;
}

/// Where scripts/deps.sh unpacks the `minio` sdist (the same version as the installed SDK).
const MINIO_TESTS: &str = "/var/cache/aquifer-minio/minio-7.2.20/tests/functional/tests.py";

/// MinIO's Python SDK functional tests, every one run and checked against the known-failure
/// and not-implemented lists in the driver script (docs/s3-conformance.md gives the reasons).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minio_functional_tests_pass() {
    require("python3", &["-c", "import minio"], "the minio SDK (pip install minio==7.2.20)");
    let tests = std::env::var("MINIO_TESTS").unwrap_or_else(|_| MINIO_TESTS.to_string());
    assert!(std::path::Path::new(&tests).exists(), "{tests} is missing: scripts/deps.sh unpacks the minio sdist there");
    let s = start().await;
    let out = tokio::process::Command::new("python3")
        .arg(script("minio_functional.py"))
        .env("ENDPOINT", s.endpoint())
        .env("ACCESS", &s.access)
        .env("SECRET", &s.secret)
        .env("MINIO_TESTS", &tests)
        .output()
        .await
        .expect("run python3");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{text}");
    assert!(out.status.success(), "MinIO functional tests: unexpected results:\n{text}");
    s.stop().await;
}
