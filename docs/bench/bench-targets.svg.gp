$d << EOD
0 0.5217 "transfer: >=64KiB: pdx/perftest >= 0.95 (hot, batch 1 and 64; worst)"
1 1.046 "transfer:   the same, batch-1 requests reused (posted again)"
2 0.8816 "transfer: 8448 B batch>=64: pdx/perftest >= 0.90 (hot; worst)"
3 6.214 "transfer: 100k-descriptor request: make+post <= 50 ns/desc (worst op)"
4 0.9609 "handoff: handoff >= 0.8 x memcpy bandwidth of the same bytes"
5 1.218 "hash: hash: pdx >= 50 x Python tokens/s (xxhash_cbor, worst prompt), identical hashes"
6 1.376 "offload: offload save >= 0.8 x memcpy"
7 1.339 "offload: offload load >= 0.8 x memcpy"
8 2.493 "offload: lookup <= 200 ns per block at 1M blocks (single-key hit)"
9 3.613 "offload: lookup <= 200 ns per block at 1M blocks (2048-key prefix)"
EOD
set terminal svg size 1250,430 dynamic noenhanced font 'Helvetica,11'
set output "./bench-targets.svg"
set title 'pdx-bench targets: value / goal (green: met; lower-is-better goals inverted)'
set lmargin 78
set style fill solid 0.7
set grid x
set logscale x 10
set xrange [0.01:100]
set yrange [-1:10]
set ytics scale 0
set arrow from 1,-1 to 1,10 nohead lw 2 front
clip(x) = x < 100 ? x : 100
plot $d using (1):1:(0.01):(clip($2)):($1-0.3):($1+0.3):($2 >= 1 ? 0x33aa33 : 0xcc4444):ytic(3) with boxxyerror lc rgb variable notitle, $d using (clip($2)):1:(sprintf('%.2f', $2)) with labels left offset 0.5,0 notitle
