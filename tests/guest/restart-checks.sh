# Sourced by check.sh and cifs-check.sh after the restart (wait_for_restart): the client
# has to write through the descriptor it opened before, and create, rename and list as before.

run restart_write_old_fd sh -c 'echo after-restart >&3'
exec 3>&-
run restart_sync sync
run restart_create sh -c 'echo created-after-restart >post.txt'
run restart_mkdir mkdir post-dir
run restart_rename mv d1/d2/d3/moved.txt d1/moved-back.txt
drop_caches
expect restart_read_fd_file "before-restart
after-restart" cat open.txt
run restart_copy_equal cmp from-host.bin copy.bin
expect restart_listing 300 sh -c 'ls many | wc -l'
run restart_rmdir rmdir post-dir
echo "AQ-PHASE2 $(cut -d' ' -f1 /proc/uptime)"
