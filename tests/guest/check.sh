# Sourced by /init with /mnt mounted. Exercises the kernel NFS client against the server and
# reports one line per check:
#   AQ-CHECK <name> ok
#   AQ-CHECK <name> FAIL <what happened>
# Between the two phases it prints "AQ-WAIT restart" and blocks until a line arrives on the
# console: the host restarts the server meanwhile, and phase 2 goes on with file handles and
# an open file descriptor obtained before the restart. tests/nfs_kernel.rs asserts every line
# and then reads the files back through REST. The host puts kc/from-host.bin there first.

ok() { echo "AQ-CHECK $1 ok"; }
fail() { name=$1; shift; echo "AQ-CHECK $name FAIL $*" | tr '\n' ' '; echo; }
# run NAME CMD...: the command must succeed.
run() {
    name=$1; shift
    if out=$("$@" 2>&1); then ok "$name"; else fail "$name" "rc=$? $out"; fi
}
# expect NAME WANT CMD...: the command must succeed and print exactly WANT.
expect() {
    name=$1 want=$2; shift 2
    got=$("$@" 2>&1); rc=$?
    if [ $rc -eq 0 ] && [ "$got" = "$want" ]; then ok "$name"; else fail "$name" "rc=$rc want [$want] got [$got]"; fi
}
# refuse NAME CMD...: the command must fail.
refuse() {
    name=$1; shift
    if out=$("$@" 2>&1); then fail "$name" "succeeded: $out"; else ok "$name"; fi
}
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

cd /mnt/kc || { fail cd "no /mnt/kc"; return; }
start=$(cut -d' ' -f1 /proc/uptime)

# Reads and writes.
run read_copy cp from-host.bin copy.bin
expect copy_size "$(stat -c %s from-host.bin)" stat -c %s copy.bin
drop_caches
run copy_equal cmp from-host.bin copy.bin
run write_small sh -c 'echo hello-from-guest >hello.txt'
run write_seq sh -c 'seq 1 200000 >seq.txt'
drop_caches
expect seq_tail 200000 tail -n 1 seq.txt
run patch_copy cp from-host.bin patch.bin
run patch_write sh -c 'printf XYZ | dd of=patch.bin bs=1 seek=1000000 conv=notrunc 2>/dev/null'
run append sh -c 'echo appended >>hello.txt'

# Truncation, down and up (the gap reads as zeros).
run trunc_prepare cp seq.txt trunc-down.txt
run trunc_down truncate -s 1000 trunc-down.txt
run trunc_up_prepare sh -c 'echo abc >trunc-up.txt'
run trunc_up truncate -s 5000 trunc-up.txt
drop_caches
expect trunc_down_size 1000 stat -c %s trunc-down.txt
expect trunc_up_size 5000 stat -c %s trunc-up.txt
expect trunc_up_zeros 0 sh -c 'tail -c 4996 trunc-up.txt | tr -d "\000" | wc -c'

# Directories.
run mkdir mkdir d1
run mkdir_nested mkdir -p d1/d2/d3
run mkdir_gone mkdir d1/gone
run rmdir rmdir d1/gone
refuse rmdir_gone_is_gone test -e d1/gone
refuse rmdir_nonempty rmdir d1
refuse mkdir_exists mkdir d1

# Renames: in a directory, across directories, over an existing file, a directory.
run rename_same_dir mv hello.txt renamed.txt
refuse rename_old_name_gone test -e hello.txt
run rename_cross_prepare sh -c 'echo moving >d1/mover.txt'
run rename_cross_dir mv d1/mover.txt d1/d2/d3/moved.txt
run rename_over_prepare sh -c 'echo new >over-src.txt && echo old-content >over-dst.txt'
run rename_over mv -f over-src.txt over-dst.txt
drop_caches
expect rename_over_content new cat over-dst.txt
run rename_dir_prepare mkdir -p dirmove/inner
run rename_dir mv dirmove d1/dirmoved
expect rename_dir_listing inner ls d1/dirmoved

# Hard links and symbolic links.
run link ln renamed.txt d1/hardlink.txt
expect link_count 2 stat -c %h renamed.txt
expect link_same_inode "$(stat -c %i renamed.txt)" stat -c %i d1/hardlink.txt
run symlink ln -s ../renamed.txt d1/sym
expect readlink ../renamed.txt readlink d1/sym
drop_caches
expect symlink_follow "hello-from-guest
appended" cat d1/sym

# Removal.
run unlink_prepare sh -c 'echo bye >doomed.txt'
run unlink rm doomed.txt
refuse unlink_gone test -e doomed.txt
run unlink_link_prepare ln seq.txt seq-link.txt
expect unlink_link_prepare_count 2 stat -c %h seq.txt
run unlink_one_link rm seq-link.txt
drop_caches
expect unlink_link_count 1 stat -c %h seq.txt

# Attributes.
run chmod chmod 0640 renamed.txt
expect chmod_mode 640 stat -c %a renamed.txt
run utimes touch -d "2001-02-03 04:05:06" seq.txt
drop_caches
expect utimes_mtime 981173106 stat -c %Y seq.txt

# A directory larger than one READDIR reply.
run many_create sh -c 'mkdir many && cd many && i=0; while [ $i -lt 300 ]; do : >"file-with-a-longish-name-$i"; i=$((i+1)); done'
drop_caches
expect many_listing 300 sh -c 'ls many | wc -l'
expect many_listing_long 300 sh -c 'ls -l many | grep -c file-with'

# Phase 2 keeps this descriptor, opened before the restart.
exec 3>open.txt
echo before-restart >&3
run sync_before sync
echo "AQ-PHASE1 $(cut -d' ' -f1 /proc/uptime) started=$start"

echo "AQ-WAIT restart"
read -r _go
echo "AQ-RESUMED $(cut -d' ' -f1 /proc/uptime)"

# After the restart: handles the client already holds must still work (no ESTALE).
expect restart_stat_old_handle 640 stat -c %a renamed.txt
run restart_write_old_fd sh -c 'echo after-restart >&3'
exec 3>&-
run restart_sync sync
run restart_create sh -c 'echo created-after-restart >post.txt'
run restart_mkdir mkdir post-dir
run restart_rename mv d1/d2/d3/moved.txt d1/moved-back.txt
# open() revalidates the cached inode with GETATTR on the handle from before the restart.
expect restart_read_old "hello-from-guest
appended" cat renamed.txt
drop_caches
expect restart_read_fd_file "before-restart
after-restart" cat open.txt
run restart_copy_equal cmp from-host.bin copy.bin
expect restart_listing 300 sh -c 'ls many | wc -l'
run restart_rmdir rmdir post-dir
echo "AQ-PHASE2 $(cut -d' ' -f1 /proc/uptime)"
cd /
