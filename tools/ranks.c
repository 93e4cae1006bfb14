/* SPDX-License-Identifier: MIT */
/* Several ranks side by side (ranks.h). */
#include "ranks.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "tracereader.h"

#define NR_SITES_KEPT 64 /* a rank's largest sites at its peak, compared by name */

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const struct rank_site *)a)->name, ((const struct rank_site *)b)->name);
}

static int cmp_bytes(const void *a, const void *b)
{
    const struct rank_site *x = a, *y = b;
    return x->bytes != y->bytes ? (x->bytes > y->bytes ? -1 : 1) : strcmp(x->name, y->name);
}

void ranks_add(struct ranks *rk, const struct cuheap_trace *t, const struct trace_summary *s)
{
    if (rk->nr == rk->cap) {
        size_t cap = rk->cap ? rk->cap * 2 : 8;
        struct rank_record *grown = realloc(rk->r, cap * sizeof(*grown));
        if (!grown)
            return;
        rk->r = grown;
        rk->cap = cap;
    }
    struct rank_record *r = &rk->r[rk->nr++];
    memset(r, 0, sizeof(*r));
    if (t->rank >= 0)
        snprintf(r->label, sizeof(r->label), "rank %ld", t->rank);
    else
        snprintf(r->label, sizeof(r->label), "pid %ld", t->pid);
    r->peak_device = r->oom_device = -1;
    for (unsigned d = 0; d < s->nr_dev; d++) {
        const struct device_summary *dv = &s->dev[d];
        if (r->peak_device < 0 || dv->peak_live > r->peak) {
            r->peak = dv->peak_live;
            r->peak_device = dv->device;
        }
        uint64_t rec = cuheap_trace_recovered(t, dv->device), n = dv->nr_ooms + dv->nr_limit;
        n -= rec < n ? rec : n;
        if (n && r->oom_device < 0)
            r->oom_device = dv->device;
        r->ooms += n;
    }
    if (r->peak_device < 0)
        return;
    struct site *sites;
    size_t nr = collect_sites(t, s, SITES_AT_PEAK, r->peak_device, &sites);
    r->sites = calloc(nr ? nr : 1, sizeof(*r->sites));
    for (size_t i = 0; r->sites && i < nr; i++) {
        cuheap_trace_site(t, sites[i].stack, r->sites[i].name, sizeof(r->sites[i].name));
        r->sites[i].bytes = sites[i].bytes;
    }
    free(sites);
    if (!r->sites)
        return;
    qsort(r->sites, nr, sizeof(*r->sites), cmp_name);
    size_t k = 0;
    for (size_t i = 0; i < nr; i++) {
        if (k && !strcmp(r->sites[k - 1].name, r->sites[i].name))
            r->sites[k - 1].bytes += r->sites[i].bytes;
        else
            r->sites[k++] = r->sites[i];
    }
    qsort(r->sites, k, sizeof(*r->sites), cmp_bytes);
    r->nr_sites = k < NR_SITES_KEPT ? k : NR_SITES_KEPT;
}

void ranks_free(struct ranks *rk)
{
    for (size_t i = 0; i < rk->nr; i++)
        free(rk->r[i].sites);
    free(rk->r);
    memset(rk, 0, sizeof(*rk));
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The median of the other ranks' values (lower middle). */
static uint64_t median(uint64_t *v, size_t n)
{
    if (!n)
        return 0;
    qsort(v, n, sizeof(*v), cmp_u64);
    return v[(n - 1) / 2];
}

static uint64_t bytes_at(const struct rank_record *r, const char *name)
{
    for (size_t i = 0; i < r->nr_sites; i++)
        if (!strcmp(r->sites[i].name, name))
            return r->sites[i].bytes;
    return 0;
}

static uint64_t abs_delta(int64_t d)
{
    return d < 0 ? (uint64_t)(-(d + 1)) + 1 : (uint64_t)d;
}

bool ranks_compare(const struct ranks *rk, struct rank_finding *ret)
{
    if (rk->nr < 2)
        return false;
    memset(ret, 0, sizeof(*ret));
    const struct rank_record *who = NULL;
    for (size_t i = 0; i < rk->nr; i++) /* the rank that ran out of memory the most */
        if (rk->r[i].ooms && (!who || rk->r[i].ooms > who->ooms))
            who = &rk->r[i];
    ret->oom = who != NULL;
    if (!who) { /* else the one that peaked highest */
        who = &rk->r[0];
        for (size_t i = 1; i < rk->nr; i++)
            if (rk->r[i].peak > who->peak)
                who = &rk->r[i];
    }
    ret->who = who;
    uint64_t *v = calloc(rk->nr, sizeof(*v));
    if (!v)
        return false;
    size_t n = 0;
    for (size_t i = 0; i < rk->nr; i++)
        if (&rk->r[i] != who)
            v[n++] = rk->r[i].peak;
    ret->others = median(v, n);
    /* every name either side: its bytes against the others' median, largest change first */
    for (size_t pass = 0; pass < rk->nr; pass++) {
        const struct rank_record *src = &rk->r[pass];
        for (size_t s = 0; s < src->nr_sites; s++) {
            const char *name = src->sites[s].name;
            bool seen = false;
            for (size_t k = 0; k < ret->nr_diff && !seen; k++)
                seen = !strcmp(ret->diff[k].name, name);
            if (seen)
                continue;
            n = 0;
            for (size_t i = 0; i < rk->nr; i++)
                if (&rk->r[i] != who)
                    v[n++] = bytes_at(&rk->r[i], name);
            uint64_t mine = bytes_at(who, name), theirs = median(v, n);
            int64_t d = (int64_t)(mine - theirs);
            if (!d)
                continue;
            size_t slot = ret->nr_diff;
            if (slot == 5) { /* replace the smallest change when this one is larger */
                slot = 0;
                for (size_t k = 1; k < 5; k++)
                    if (abs_delta(ret->delta[k]) < abs_delta(ret->delta[slot]))
                        slot = k;
                if (abs_delta(ret->delta[slot]) >= abs_delta(d))
                    continue;
            } else {
                ret->nr_diff++;
            }
            snprintf(ret->diff[slot].name, sizeof(ret->diff[slot].name), "%s", name);
            ret->delta[slot] = d;
            ret->mine[slot] = mine;
            ret->theirs[slot] = theirs;
        }
    }
    free(v);
    for (size_t i = 0; i < ret->nr_diff; i++) /* largest change first */
        for (size_t k = i + 1; k < ret->nr_diff; k++)
            if (abs_delta(ret->delta[k]) > abs_delta(ret->delta[i])) {
                struct rank_site s = ret->diff[i];
                int64_t d = ret->delta[i];
                uint64_t m = ret->mine[i], t = ret->theirs[i];
                ret->diff[i] = ret->diff[k];
                ret->delta[i] = ret->delta[k];
                ret->mine[i] = ret->mine[k];
                ret->theirs[i] = ret->theirs[k];
                ret->diff[k] = s;
                ret->delta[k] = d;
                ret->mine[k] = m;
                ret->theirs[k] = t;
            }
    return true;
}

static const char *signed_bytes(int64_t d, char *buf, size_t size)
{
    char b[32];
    snprintf(buf, size, "%s%s", d < 0 ? "-" : "+", human_bytes(abs_delta(d), b, sizeof(b)));
    return buf;
}

/* The headline: who, what, by how much. */
static void headline(const struct ranks *rk, const struct rank_finding *fd, char *buf, size_t size)
{
    char b1[32], b2[32], b3[32];
    const struct rank_record *w = fd->who;
    uint64_t above = w->peak > fd->others ? w->peak - fd->others : 0;
    size_t n = 0;
    if (fd->oom) {
        int m = snprintf(buf, size, "%s ran out of memory (%" PRIu64 " time%s on GPU %d)", w->label,
                         w->ooms, w->ooms == 1 ? "" : "s", w->oom_device);
        n = m > 0 ? (size_t)m : 0;
        size_t others = 0;
        for (size_t i = 0; i < rk->nr; i++)
            others += &rk->r[i] != w && rk->r[i].ooms;
        if (!others && n < size)
            n += (size_t)snprintf(buf + n, size - n, ", the others never");
        if (n < size)
            n += (size_t)snprintf(buf + n, size - n, "; it peaked at %s",
                                  human_bytes(w->peak, b1, sizeof(b1)));
    } else {
        int m = snprintf(buf, size, "%s peaked highest: %s on GPU %d", w->label,
                         human_bytes(w->peak, b1, sizeof(b1)), w->peak_device);
        n = m > 0 ? (size_t)m : 0;
    }
    if (n < size)
        snprintf(buf + n, size - n, ", %s above the others' median (%s, %.1f%%)",
                 human_bytes(above, b2, sizeof(b2)), human_bytes(fd->others, b3, sizeof(b3)),
                 fd->others ? 100.0 * (double)above / (double)fd->others : 0.0);
}

void ranks_print(FILE *f, const struct ranks *rk)
{
    struct rank_finding fd;
    if (!ranks_compare(rk, &fd))
        return;
    char line[512], b1[32], b2[32], b3[32];
    headline(rk, &fd, line, sizeof(line));
    fprintf(f, "\n== across %zu ranks\n  %s\n", rk->nr, line);
    for (size_t i = 0; i < rk->nr; i++)
        fprintf(f, "  %-10s peak %10s on GPU %d%s\n", rk->r[i].label,
                human_bytes(rk->r[i].peak, b1, sizeof(b1)), rk->r[i].peak_device,
                rk->r[i].ooms ? ", out of memory" : "");
    if (!fd.nr_diff) {
        fprintf(f, "  its call sites at the peak hold what the others' do\n");
        return;
    }
    fprintf(f, "  where %s differs at its peak (its bytes against the others' median):\n",
            fd.who->label);
    for (size_t i = 0; i < fd.nr_diff; i++)
        fprintf(f, "  %11s  %s (%s against %s)\n", signed_bytes(fd.delta[i], b1, sizeof(b1)),
                fd.diff[i].name, human_bytes(fd.mine[i], b2, sizeof(b2)),
                human_bytes(fd.theirs[i], b3, sizeof(b3)));
}

void ranks_print_html(FILE *f, const struct ranks *rk, void (*esc)(FILE *, const char *))
{
    struct rank_finding fd;
    if (!ranks_compare(rk, &fd))
        return;
    char line[512], b1[32], b2[32], b3[32];
    headline(rk, &fd, line, sizeof(line));
    fprintf(f, "<h2>Across %zu ranks</h2>\n<p><b>", rk->nr);
    esc(f, line);
    fputs("</b></p>\n", f);
    if (!fd.nr_diff)
        return;
    fputs("<table><tr><th>change</th><th>call site</th><th>", f);
    esc(f, fd.who->label);
    fputs("</th><th>others' median</th></tr>\n", f);
    for (size_t i = 0; i < fd.nr_diff; i++) {
        fprintf(f, "<tr><td>%s</td><td>", signed_bytes(fd.delta[i], b1, sizeof(b1)));
        esc(f, fd.diff[i].name);
        fprintf(f, "</td><td>%s</td><td>%s</td></tr>\n", human_bytes(fd.mine[i], b2, sizeof(b2)),
                human_bytes(fd.theirs[i], b3, sizeof(b3)));
    }
    fputs("</table>\n", f);
}
