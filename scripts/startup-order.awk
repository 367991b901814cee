# The functions of one binary in a callgrind profile, first seen first:
# scripts/startup-order.sh writes them to crates/sigil/startup.order.
#   awk -v bin=/path/to/sigil -f scripts/startup-order.awk callgrind.out
# callgrind names each object (ob=) and function (fn=) once as "(id) name"
# and by "(id)" afterwards. Left out: addresses without a symbol (0x...) and
# callgrind's pseudo-functions such as "(below main)".
/^(ob|cob|fn|cfn)=\(/ {
  eq = index($0, "="); kind = substr($0, 1, eq - 1)
  cl = index($0, ")"); id = substr($0, eq + 2, cl - eq - 2); name = substr($0, cl + 2)
  if (kind ~ /ob$/) { if (name != "") ob[id] = name; if (kind == "ob") cur = ob[id]; next }
  if (name != "") fn[id] = name
  if (kind == "fn" && cur == bin && fn[id] !~ /^0x|[ (]/ && !(fn[id] in seen)) { seen[fn[id]] = 1; print fn[id] }
}
