# READ: pdx, batch 1
$d0_0 << EOD
8448 47.0001
41984 97.724
65536 90.0174
1.04858e+06 49.1387
3.50259e+06 25.934
EOD
# READ: ucx_perftest
$d0_1 << EOD
8448 112.216
41984 128.418
65536 100.096
1.04858e+06 49.5765
3.50259e+06 52.3267
EOD
# READ: memcpy (one thread)
$d0_2 << EOD
8448 133.401
41984 141.948
65536 108.167
1.04858e+06 50.8584
3.50259e+06 52.4415
EOD
# READ: pdx, batch 64
$d0_3 << EOD
8448 122.05
41984 116.908
65536 176.772
1.04858e+06 107.255
3.50259e+06 67.1968
EOD
# READ: pdx, batch 1024
$d0_4 << EOD
8448 89.0319
41984 144.679
65536 188.93
1.04858e+06 96.1078
3.50259e+06 66.9063
EOD
# WRITE: pdx, batch 1
$d1_0 << EOD
8448 45.5182
41984 99.0053
65536 89.0661
1.04858e+06 49.0936
3.50259e+06 79.727
EOD
# WRITE: ucx_perftest
$d1_1 << EOD
8448 68.6719
41984 104.886
65536 78.947
1.04858e+06 47.3145
3.50259e+06 44.1494
EOD
# WRITE: memcpy (one thread)
$d1_2 << EOD
8448 133.401
41984 141.948
65536 108.167
1.04858e+06 50.8584
3.50259e+06 52.4415
EOD
# WRITE: pdx, batch 64
$d1_3 << EOD
8448 120.264
41984 114.012
65536 128.153
1.04858e+06 123.322
3.50259e+06 76.9746
EOD
# WRITE: pdx, batch 1024
$d1_4 << EOD
8448 87.2802
41984 145.157
65536 191.113
1.04858e+06 86.3235
3.50259e+06 71.2551
EOD
set terminal svg size 1320,720 dynamic noenhanced font 'Helvetica,12'
set output "./bench-transfer.svg"
set grid
set key below font ',10'
set logscale x 2
set format x '%.0b%BB'
set logscale y 10
set xlabel "message size"
set ylabel "GB/s"
set multiplot layout 1,2 title "pdx-bench transfer: two processes, one host"
set title "READ"
plot $d0_0 using 1:2 with linespoints dt 1 lw 2 title "pdx, batch 1", $d0_1 using 1:2 with linespoints dt 2 lw 2 title "ucx_perftest", $d0_2 using 1:2 with linespoints dt 2 lw 2 title "memcpy (one thread)", $d0_3 using 1:2 with linespoints dt 1 lw 2 title "pdx, batch 64", $d0_4 using 1:2 with linespoints dt 1 lw 2 title "pdx, batch 1024"
set title "WRITE"
plot $d1_0 using 1:2 with linespoints dt 1 lw 2 title "pdx, batch 1", $d1_1 using 1:2 with linespoints dt 2 lw 2 title "ucx_perftest", $d1_2 using 1:2 with linespoints dt 2 lw 2 title "memcpy (one thread)", $d1_3 using 1:2 with linespoints dt 1 lw 2 title "pdx, batch 64", $d1_4 using 1:2 with linespoints dt 1 lw 2 title "pdx, batch 1024"
unset multiplot
