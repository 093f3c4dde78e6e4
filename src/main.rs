//! `aquifer`: the daemon (`aquifer serve`) and the command-line client of its REST API.

mod cli;
mod serve;

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
    #[command(flatten)]
    Client(cli::Command),
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let res = match args.cmd {
        Cmd::Serve(a) => serve::run(a),
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
