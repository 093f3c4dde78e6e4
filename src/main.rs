//! `aquifer`: the daemon (`aquifer serve`) and the command-line client of its REST API.

mod bench_train;
mod cli;
mod export_api;
mod portal_api;
mod serve;
mod share_api;
mod wan_cmd;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "aquifer", version, about = "Aquifer storage appliance: daemon and admin CLI")]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the daemon (with no configuration: an embedded single-node default).
    Serve(serve::ServeArgs),
    /// Benchmarks run against a daemon: `bench dataset` writes a training dataset, `bench train`
    /// emulates a data loader reading it.
    Bench(bench_train::BenchArgs),
    /// A TCP proxy that adds WAN delay, a bandwidth cap and cut/restore between two daemons.
    WanEmulator(wan_cmd::WanArgs),
    #[command(flatten)]
    Client(cli::Command),
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let res = match args.cmd {
        Cmd::Serve(a) => serve::run(a),
        Cmd::Bench(a) => bench_train::run(a),
        Cmd::WanEmulator(a) => wan_cmd::run(a),
        Cmd::Client(c) => cli::run(c),
    };
    match res {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("aquifer: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
