//! What hardware this node has, read from /proc and /sys.

use std::fs;
use std::path::Path;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inventory {
    /// Logical CPUs (hardware threads).
    pub cpus: usize,
    pub memory_bytes: u64,
    /// Every block device the kernel lists, sorted by name; virtual ones (loop, zram)
    /// included, so that callers decide what counts as a drive.
    pub block_devices: Vec<BlockDeviceInfo>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockDeviceInfo {
    /// Kernel name, e.g. `nvme0n1`; the device node is `/dev/<name>`.
    pub name: String,
    pub size_bytes: u64,
    pub rotational: bool,
    /// Model string as the drive reports it; None for virtual devices.
    pub model: Option<String>,
}

/// Reads the node's inventory. Anything missing (a container without /sys, an unusual kernel)
/// shows up as zero or empty rather than an error, so that a node can always describe itself.
pub fn inventory() -> Inventory {
    inventory_from(Path::new("/proc"), Path::new("/sys/block"))
}

pub(crate) fn inventory_from(proc: &Path, sys_block: &Path) -> Inventory {
    Inventory {
        cpus: cpu_count(proc),
        memory_bytes: memory_bytes(proc),
        block_devices: block_devices(sys_block),
    }
}

fn cpu_count(proc: &Path) -> usize {
    let from_cpuinfo = fs::read_to_string(proc.join("cpuinfo"))
        .map(|text| text.lines().filter(|l| l.split(':').next().is_some_and(|k| k.trim() == "processor")).count())
        .unwrap_or(0);
    if from_cpuinfo > 0 {
        return from_cpuinfo;
    }
    // Without /proc/cpuinfo, the scheduler's view is the next best answer.
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
}

fn memory_bytes(proc: &Path) -> u64 {
    let Ok(text) = fs::read_to_string(proc.join("meminfo")) else { return 0 };
    text.lines()
        .find_map(|line| {
            let rest = line.strip_prefix("MemTotal:")?;
            let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
            kib.checked_mul(1024)
        })
        .unwrap_or(0)
}

fn block_devices(sys_block: &Path) -> Vec<BlockDeviceInfo> {
    let Ok(entries) = fs::read_dir(sys_block) else { return Vec::new() };
    let read = |path: &Path| fs::read_to_string(path).ok().map(|s| s.trim().to_string());
    let mut devices: Vec<BlockDeviceInfo> = entries
        .filter_map(Result::ok)
        .map(|entry| {
            let dir = entry.path();
            // /sys/block/<dev>/size counts 512-byte sectors whatever the device's sector size.
            let sectors: u64 = read(&dir.join("size")).and_then(|s| s.parse().ok()).unwrap_or(0);
            BlockDeviceInfo {
                name: entry.file_name().to_string_lossy().into_owned(),
                size_bytes: sectors.saturating_mul(512),
                rotational: read(&dir.join("queue/rotational")).is_some_and(|s| s == "1"),
                model: read(&dir.join("device/model")).filter(|s| !s.is_empty()),
            }
        })
        .collect();
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    devices
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_and_sys_block() {
        let root = tempfile::tempdir().unwrap();
        let proc = root.path().join("proc");
        let sys = root.path().join("block");
        fs::create_dir_all(&proc).unwrap();
        fs::write(proc.join("cpuinfo"), "processor\t: 0\nmodel name\t: X\n\nprocessor\t: 1\n\nprocessor\t: 2\n").unwrap();
        fs::write(proc.join("meminfo"), "MemTotal:       16384 kB\nMemFree:  100 kB\n").unwrap();
        for (name, sectors, rot, model) in [("sda", "2048", "1", Some("ST4000 \n")), ("nvme0n1", "8", "0", Some("Fast NVMe")), ("loop0", "0", "0", None)] {
            let dir = sys.join(name);
            fs::create_dir_all(dir.join("queue")).unwrap();
            fs::write(dir.join("size"), format!("{sectors}\n")).unwrap();
            fs::write(dir.join("queue/rotational"), rot).unwrap();
            if let Some(model) = model {
                fs::create_dir_all(dir.join("device")).unwrap();
                fs::write(dir.join("device/model"), model).unwrap();
            }
        }
        let inv = inventory_from(&proc, &sys);
        assert_eq!(inv.cpus, 3);
        assert_eq!(inv.memory_bytes, 16384 * 1024);
        let names: Vec<&str> = inv.block_devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["loop0", "nvme0n1", "sda"]);
        assert_eq!(
            inv.block_devices[2],
            BlockDeviceInfo { name: "sda".into(), size_bytes: 2048 * 512, rotational: true, model: Some("ST4000".into()) }
        );
        assert_eq!(inv.block_devices[1].size_bytes, 4096);
        assert!(!inv.block_devices[1].rotational);
        assert_eq!(inv.block_devices[0].model, None);
    }

    #[test]
    fn missing_files_give_empty_answers() {
        let root = tempfile::tempdir().unwrap();
        let inv = inventory_from(&root.path().join("nope"), &root.path().join("nope"));
        assert_eq!(inv.memory_bytes, 0);
        assert!(inv.block_devices.is_empty());
        // cpus falls back to the scheduler's count.
        assert_eq!(inv.cpus, std::thread::available_parallelism().unwrap().get());
    }

    #[test]
    fn this_machine() {
        let inv = inventory();
        assert!(inv.cpus >= 1);
        if Path::new("/proc/meminfo").exists() {
            assert!(inv.memory_bytes > 0);
        }
        if Path::new("/sys/block").exists() {
            assert!(!inv.block_devices.is_empty());
        }
    }
}
