/*
 * L1: a cursor walk of the object table (l1.h, kvt_l1_scan), for the
 * operator's listings.
 */
#include "l1/l1_int.h"

bool kvt_l1_scan(struct kvt_l1 *l1, uint32_t *cursor,
                 bool (*visit)(const struct kvt_l1_entry *e, void *arg), void *arg)
{
    pthread_mutex_lock(&l1->lock);
    uint32_t h = *cursor;
    bool end = true;
    for (; h < l1->hwm; h++) {
        const struct l1_obj *o = obj(l1, h);
        if (o->state != ST_READY || (o->flags & F_UNMAPPED))
            continue;
        struct kvt_l1_entry e = {
            .key = o->key, .len = o->meta.len, .refs = o->refs, .temp = o->flags & F_TEMP};
        if (!visit(&e, arg)) {
            h++;
            end = h >= l1->hwm;
            break;
        }
    }
    *cursor = h;
    pthread_mutex_unlock(&l1->lock);
    return end;
}
