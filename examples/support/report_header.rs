//! The header every benchmark report starts with: what ran, where, and on which build.

use std::process::Command;

/// Prints `# {title}` and the run's facts: date, machine, load, rustc, commit, profile.
pub fn print(title: &str) {
    println!("# {title}\n");
    println!(
        "- date: {}",
        command("date", &["-u", "+%Y-%m-%d %H:%M:%S UTC"])
    );
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split_once(':'))
                .map(|(_, model)| model.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    println!("- machine: {} CPUs (nproc), {cpu}", command("nproc", &[]));
    if let Ok(load) = std::fs::read_to_string("/proc/loadavg") {
        let load: Vec<&str> = load.split_whitespace().take(3).collect();
        println!("- load average before the run: {}", load.join(" "));
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    println!("- rustc: {}", command(&rustc, &["--version"]));
    let commit = command("git", &["rev-parse", "--short", "HEAD"]);
    let dirty = !command("git", &["status", "--porcelain", "--untracked-files=no"]).is_empty();
    println!(
        "- commit: {commit}{}",
        if dirty { " (with local changes)" } else { "" }
    );
    println!(
        "- build: {}",
        if cfg!(debug_assertions) {
            "DEBUG (numbers are meaningless: use --release)"
        } else {
            "release"
        }
    );
}

/// The trimmed output of a command, or "unknown".
fn command(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}
