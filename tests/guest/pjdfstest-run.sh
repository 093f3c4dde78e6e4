# Sourced by /init with /mnt mounted: runs pjdfstest in /mnt/pjdfstest. Arguments, if any,
# are pjdfstest's test patterns. The host driver is tests/guest/pjdfstest.sh.
mkdir -p /mnt/pjdfstest
echo "AQ-PJDFSTEST-BEGIN $(cut -d' ' -f1 /proc/uptime)"
NO_COLOR=1 pjdfstest -c /guest/pjdfstest.toml -p /mnt/pjdfstest "$@"
echo "AQ-PJDFSTEST-END rc=$? $(cut -d' ' -f1 /proc/uptime)"
cd /
