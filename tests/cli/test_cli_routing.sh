#!/usr/bin/env bash
# `strata run --routing-out / --routing-in` on the CPU (tiny preset): replaying a run's own routing
# gives its logits bit for bit (one prompt, a batch, lines in another order), a replayed file really
# overrides the engine's choice (an edited set changes the logits and is what the run reports), and a
# file that does not fit the model or the prompts is refused with a clear message (exit 1).
set -u
bin=${STRATA_BIN:?}/strata
tmp=$(mktemp -d "${STRATA_TEST_TMP:-/tmp}/cli-routing.XXXXXX" 2>/dev/null || mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass+1)); echo "ok   $1"; }
bad() { fail=$((fail+1)); echo "FAIL $1"; }
check() { if eval "$2"; then ok "$1"; else bad "$1"; fi; }

"$bin" ckpt init --preset tiny --out "$tmp/ck" --seed 3 >/dev/null 2>&1 || { echo "ckpt init failed"; exit 1; }
run() { "$bin" run --ckpt "$tmp/ck" --max-tokens 5 --ignore-eos --print-tokens "$@"; }
P="--prompt-tokens 5,6,7,8"

# own routing replayed: same logits, same tokens, same routing written back
run $P --dump-logits "$tmp/a.npy" --routing-out "$tmp/a.rt" >"$tmp/a.txt" 2>/dev/null
# tiny: 8 layers, 16 experts, MoE layers 1..7; 4 prompt + 4 fed-back generated positions
check "routing file: header and one line per position and MoE layer (8 x 7)" \
  "[ \"\$(head -2 $tmp/a.rt | tr '\n' '|')\" = 'strata-routing 1|layers 8 experts 16|' ] && [ \$(grep -vc '^#' $tmp/a.rt) -eq 58 ]"
check "every line: seq pos token layer n=top_k ids ascending in [0,16)" \
  "awk 'NR>2 && !/^#/ { if (\$5 != 4 || NF != 9 || \$4 < 1 || \$4 > 7) bad=1; for (i=6;i<NF;i++) if (\$i >= \$(i+1)) bad=1; if (\$NF > 15) bad=1 } END { exit bad }' $tmp/a.rt"
run $P --dump-logits "$tmp/b.npy" --routing-in "$tmp/a.rt" --routing-out "$tmp/b.rt" >"$tmp/b.txt" 2>/dev/null
check "replaying its own routing: logits bit for bit" "cmp -s $tmp/a.npy $tmp/b.npy"
check "replaying its own routing: same tokens, same routing written" "cmp -s $tmp/a.txt $tmp/b.txt && cmp -s $tmp/a.rt $tmp/b.rt"
{ head -3 "$tmp/a.rt"; tail -n +4 "$tmp/a.rt" | tac; } >"$tmp/rev.rt"
run $P --dump-logits "$tmp/c.npy" --routing-in "$tmp/rev.rt" >/dev/null 2>&1
check "lines in another order: logits bit for bit" "cmp -s $tmp/a.npy $tmp/c.npy"
# greedy without a dump takes the engine's argmax: the replay still gives the same tokens
run $P --routing-in "$tmp/a.rt" >"$tmp/g.txt" 2>/dev/null
check "greedy (engine argmax) replay: same tokens" "cmp -s $tmp/a.txt $tmp/g.txt"

# the replayed sets are the ones used: another set at prompt position 2, layer 3 changes the logits
awk '$1==0 && $2==2 && $4==3 { $6=0; $7=1; $8=2; $9=3 } { print }' "$tmp/a.rt" >"$tmp/e.rt"
check "edited file differs from the recorded one" "! cmp -s $tmp/a.rt $tmp/e.rt"
run $P --dump-logits "$tmp/e.npy" --routing-in "$tmp/e.rt" --routing-out "$tmp/e2.rt" >/dev/null 2>&1
check "an edited set changes the logits" "[ -s $tmp/e.npy ] && ! cmp -s $tmp/a.npy $tmp/e.npy"
check "the run's written routing at the edited position is the replayed set" \
  "grep -q '^0 2 7 3 4 0 1 2 3\$' $tmp/e2.rt"

# a batch of prompts (sequence = line of the batch file), quantile mode (top-k until thresholds)
printf 'tokens: 5,6,7,8\nHello there\ntokens: 9\n' >"$tmp/batch.txt"
run --batch-file "$tmp/batch.txt" --routing quantile --dump-logits "$tmp/m.npy" --routing-out "$tmp/m.rt" >/dev/null 2>&1
run --batch-file "$tmp/batch.txt" --routing quantile --dump-logits "$tmp/n.npy" --routing-in "$tmp/m.rt" >/dev/null 2>&1
check "batch: three sequences in the file" "[ \"\$(awk 'NR>3 {print \$1}' $tmp/m.rt | sort -u | tr '\n' ' ')\" = '0 1 2 ' ]"
check "batch: each prompt's logits bit for bit" \
  "cmp -s $tmp/m.0.npy $tmp/n.0.npy && cmp -s $tmp/m.1.npy $tmp/n.1.npy && cmp -s $tmp/m.2.npy $tmp/n.2.npy"
check "batch replay of sequence 0 equals its own routing alone" \
  "[ \"\$(awk 'NR>3 && \$1==0' $tmp/m.rt | sort)\" = \"\$(awk 'NR>3' $tmp/a.rt | sort)\" ]"

# files that do not fit: exit 1, a message naming the problem
refuse() { # name, file, expected message (grep -E), [extra args]
  local name=$1 f=$2 msg=$3; shift 3
  run $P --routing-in "$f" "$@" >/dev/null 2>"$tmp/err"; local rc=$?
  if [ $rc -eq 1 ] && grep -qE "$msg" "$tmp/err"; then ok "refused: $name"; else bad "refused: $name (rc $rc: $(cat "$tmp/err" | tail -1))"; fi
}
body() { tail -n +4 "$tmp/a.rt"; }
hdr="strata-routing 1
layers 8 experts 16"
printf 'hello\n' >"$tmp/x1"; refuse "not a routing file" "$tmp/x1" "not a strata routing file"
{ echo "strata-routing 2"; echo "layers 8 experts 16"; body; } >"$tmp/x2"; refuse "another version" "$tmp/x2" "version 2"
{ echo "strata-routing 1"; echo "layers 12 experts 64"; body; } >"$tmp/x3"; refuse "another model" "$tmp/x3" "12 layers and 64 experts"
echo "strata-routing 1" >"$tmp/x4"; refuse "no model line" "$tmp/x4" "layers L experts N"
{ echo "$hdr"; body; echo "0 0 5 0 4 1 2 3 4"; } >"$tmp/x5"; refuse "a dense layer" "$tmp/x5" "layer 0 is not a MoE layer"
{ echo "$hdr"; body; echo "0 0 5 8 4 1 2 3 4"; } >"$tmp/x6"; refuse "a layer past the model" "$tmp/x6" "layer 8 is not a MoE layer"
{ echo "$hdr"; body; echo "0 8 5 1 4 1 2 3 4"; } >"$tmp/x7"; refuse "a position past prompt + max-tokens" "$tmp/x7" "position 8 of sequence 0 is beyond"
{ echo "$hdr"; body; echo "1 0 5 1 4 1 2 3 4"; } >"$tmp/x8"; refuse "a sequence the run does not have" "$tmp/x8" "sequence 1, but this run has 1 prompt"
{ echo "$hdr"; body | sed '1s/^0 0 5 /0 0 6 /'; } >"$tmp/x9"; refuse "another prompt token" "$tmp/x9" "recorded for token 6; the prompt has 5"
refuse "another prompt" "$tmp/a.rt" "recorded for token 5; the prompt has 9" --prompt-tokens 9,6,7,8
{ echo "$hdr"; body | sed '1s/ [0-9]*$/ 16/'; } >"$tmp/x10"; refuse "an expert id out of range" "$tmp/x10" "expert id 16"
{ echo "$hdr"; body | sed '1s/^\(0 0 5 1 4\) .*/\1 3 2 5 9/'; } >"$tmp/x11"; refuse "ids not ascending" "$tmp/x11" "ascending and distinct"
{ echo "$hdr"; body | sed '1s/^\(0 0 5 1\) 4 .*/\1 5 1 2 3 4 5/'; } >"$tmp/x12"; refuse "more ids than top-k" "$tmp/x12" "5 experts for one token; this engine routes at most 4"
{ echo "$hdr"; body | sed '1s/^\(0 0 5 1\) 4 .*/\1 9 1 2 3 4 5 6 7 8 9/'; } >"$tmp/x12b"
run $P --routing quantile --routing-in "$tmp/x12b" >/dev/null 2>"$tmp/err"; rc=$?
check "quantile mode takes up to 2k = 8 ids, refuses 9" "[ $rc -eq 1 ] && grep -q 'routes at most 8' $tmp/err"
{ echo "$hdr"; body | sed '1s/^\(0 0 5 1 4\) .*/\1 1 2/'; } >"$tmp/x13"; refuse "fewer ids than announced" "$tmp/x13" "4 expert ids announced, 2 given"
{ echo "$hdr"; body | sed '1s/$/ 15/'; } >"$tmp/x14"; refuse "more ids than announced" "$tmp/x14" "more than the 4 expert ids"
{ echo "$hdr"; body; body | head -1; } >"$tmp/x15"; refuse "a line given twice" "$tmp/x15" "given twice"
{ echo "$hdr"; body | sed '1s/^0 0 5/0 x 5/'; } >"$tmp/x16"; refuse "a malformed line" "$tmp/x16" "line 3: expected"
{ echo "$hdr"; body | grep -v '^0 6 '; } >"$tmp/x17"; refuse "a missing position (at run time)" "$tmp/x17" "no line for sequence 0 position 6 layer 1"
{ echo "$hdr"; body | awk '$2==5 { $3 = ($3 + 1) % 512 } { print }'; } >"$tmp/x18"
refuse "another generated token (at run time)" "$tmp/x18" "position 5 of sequence 0 was recorded for token [0-9]+; this run feeds"
refuse "a file that does not exist" "$tmp/none.rt" "none.rt"
run $P --routing-out "$tmp/no-such-dir/o.rt" >/dev/null 2>"$tmp/err"; rc=$?
check "routing-out to an unwritable path: exit 1 with a message" "[ $rc -eq 1 ] && grep -q 'no-such-dir' $tmp/err"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
