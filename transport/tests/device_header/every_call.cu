extern "C" __global__ void every_call(char* a, char* b, unsigned long long* sig, int pe)
{
    gpulmt_put(a, b, 100, pe); gpulmt_put_nbi(a, b, 100, pe); gpulmt_put_warp(a, b, 100, pe);
    gpulmt_put_nbi_warp(a, b, 100, pe); gpulmt_put_block(a, b, 100, pe); gpulmt_put_nbi_block(a, b, 100, pe);
    gpulmt_get(b, a, 100, pe); gpulmt_get_nbi(b, a, 100, pe); gpulmt_get_warp(b, a, 100, pe);
    gpulmt_get_nbi_warp(b, a, 100, pe); gpulmt_get_block(b, a, 100, pe); gpulmt_get_nbi_block(b, a, 100, pe);
    gpulmt_put_signal(a, b, 8, sig, 1, GPULMT_SIGNAL_SET, pe); gpulmt_put_signal_nbi(a, b, 8, sig, 1, GPULMT_SIGNAL_ADD, pe);
    gpulmt_put_signal_warp(a, b, 8, sig, 1, GPULMT_SIGNAL_SET, pe); gpulmt_put_signal_nbi_warp(a, b, 8, sig, 1, 0, pe);
    gpulmt_put_signal_block(a, b, 8, sig, 1, 0, pe); gpulmt_put_signal_nbi_block(a, b, 8, sig, 1, 0, pe);
    gpulmt_put2d_nbi_block(a, 64, b, 32, 16, 4, pe); gpulmt_put2d_signal_block(a, 64, b, 32, 16, 4, sig, 2, 0, pe);
    gpulmt_signal_op(sig, 3, GPULMT_SIGNAL_ADD, pe);
    unsigned long long v = gpulmt_signal_wait_until(sig, GPULMT_CMP_GE, 1) + gpulmt_signal_fetch(sig);
    v += gpulmt_atomic_fetch_add(sig, 1, pe) + gpulmt_atomic_compare_swap(sig, 1, 2, pe) + gpulmt_atomic_swap(sig, 3, pe);
    gpulmt_atomic_add(sig, 1, pe); gpulmt_atomic_set(sig, 4, pe); v += gpulmt_atomic_fetch(sig, pe);
    gpulmt_fence(); gpulmt_quiet(); gpulmt_sync_grid(); gpulmt_barrier_all_block(); gpulmt_barrier_all();
    void* p = gpulmt_ptr(a, pe);
    if (p) ((unsigned long long*)p)[0] = v + gpulmt_my_pe() + gpulmt_n_pes();
}
