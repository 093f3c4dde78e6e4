# Sourced by check.sh and cifs-check.sh in /mnt/kc: the file operations both clients are
# checked on (checklib.sh reports them). The host's test reads the results back through REST
# (assert_check_files in tests/common/guest.rs).

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

# Symbolic links.
run symlink ln -s ../renamed.txt d1/sym
expect readlink ../renamed.txt readlink d1/sym
drop_caches
expect symlink_follow "hello-from-guest
appended" cat d1/sym

# Removal.
run unlink_prepare sh -c 'echo bye >doomed.txt'
run unlink rm doomed.txt
refuse unlink_gone test -e doomed.txt

# Times.
run utimes touch -d "2001-02-03 04:05:06" seq.txt
drop_caches
expect utimes_mtime 981173106 stat -c %Y seq.txt

# A directory larger than one READDIR reply.
run many_create sh -c 'mkdir many && cd many && i=0; while [ $i -lt 300 ]; do : >"file-with-a-longish-name-$i"; i=$((i+1)); done'
drop_caches
expect many_listing 300 sh -c 'ls many | wc -l'
expect many_listing_long 300 sh -c 'ls -l many | grep -c file-with'
