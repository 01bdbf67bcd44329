# contiguous block ids: pdx (KV connector)
$d0_0 << EOD
8192 17.355
32768 17.0877
131072 14.9226
EOD
# contiguous block ids: memcpy of the same bytes
$d0_1 << EOD
8192 17.4582
32768 17.7863
131072 9.20866
EOD
set terminal svg size 660,720 dynamic noenhanced font 'Helvetica,12'
set output "./bench-handoff.svg"
set grid
set key below font ',10'
set logscale y 10
set xlabel "prompt tokens"
set ylabel "GB/s"
set multiplot layout 1,1 title "pdx-bench handoff: GLM-5.2 request P -> D"
set title "contiguous block ids"
plot $d0_0 using 1:2 with linespoints dt 1 lw 2 title "pdx (KV connector)", $d0_1 using 1:2 with linespoints dt 2 lw 2 title "memcpy of the same bytes"
unset multiplot
