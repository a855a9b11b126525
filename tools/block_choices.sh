# SPDX-License-Identifier: BSD-3-Clause
# block_choices.sh: sourced by the device scripts that build with some of
# generator/plan_block.c's layout choices turned on.
#   block_choices_keep        save the tree's plan_block.c (put back on exit)
#   block_choices [NAME...]   the tree's file with those fields of its
#                             block_checked true (none: the tree's
#                             choices); fails on a name it cannot turn
#                             on. Removes plan_block.o: the device keeps
#                             build outputs between calls and the copy's
#                             files may keep old times.
block_choices_tree=/tmp/plan_block.c.tree  # the device copy has no git history
block_choices_keep() {
  cp generator/plan_block.c "$block_choices_tree"
  trap 'cp "$block_choices_tree" generator/plan_block.c' EXIT
}
block_choices() {
  cp "$block_choices_tree" generator/plan_block.c
  local n
  for n in "$@"; do
    sed -i "s/^\( *\)\.${n} = false,\$/\1.${n} = true,/" generator/plan_block.c
    grep -q "^ *\.${n} = true,\$" generator/plan_block.c ||
      { echo "block_choices: no choice $n in generator/plan_block.c"; return 1; }
  done
  rm -f build/generator/plan_block.o
  echo "block choices: $* on, $(grep -c "^ *\.[a-z0-9_]* = true,\$" generator/plan_block.c) in all"
}
