# shellcheck shell=bash
# gridengine.master_addr_command (@COMMAND@), verbatim in a function, so the site's text may hold comments and
# quotes; run in the batch script, which runs on the first host of $PE_HOSTFILE (the job's master host). Part of
# hosts.sh.

master_addr_command() {  # gridengine.master_addr_command: the first word it prints is MASTER_ADDR
@COMMAND@
}
if ! said=$(master_addr_command) || ! read -r master_addr _ <<< "$said" || [ -z "$master_addr" ]; then
  echo "bcp-pipeline: gridengine.master_addr_command gave no address on $(hostname): ${said:-(nothing printed)}" >&2
  exit 1
fi
